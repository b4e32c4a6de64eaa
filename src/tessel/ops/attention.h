// Scaled dot-product attention: one fused, memory-efficient kernel (FlashAttention-style;
// docs/attention.md).
#pragma once

#include <array>
#include <string_view>

#include "tessel/core/tensor.h"

namespace tessel {

// out[B, H, T, D] = softmax(q k^T · scale (+ causal mask)) v for q [B, H, T, D] and k, v
// [B, Hkv, S, D] with H a multiple of Hkv (grouped-query attention: query head h reads kv
// head h / (H / Hkv)). Causal hides key j from query i when j > i + (S - T); a query that
// sees no key (causal with T > S) gets zeros. scale 0 means 1/sqrt(D). q, k, v may be strided
// views (e.g. a permuted [B, T, H, D]). Nothing of size T×S is kept for the backward (only
// out and a log-sum-exp per query row), so memory is linear in the sequence.
// recompute_probs: accepted for the callers of selective recompute and ignored — the fused
// kernel never keeps the probabilities, so there is nothing left to recompute.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                                    double scale = 0.0, bool recompute_probs = false);

// Dropout on the attention probabilities (GPT-2's attn_pdrop), after the softmax: each is
// zeroed with probability p and the rest scaled by 1/(1-p). Whether the probability of (batch
// row b, head h, query i, key j) is dropped is a pure function of (seed, stream, its index in
// the global [B, H, T, S] tensor, b counted from row0 — the input's first row in the step's
// batch), so every layout and thread count draws the same mask, and the backward draws it
// again instead of keeping it. p = 0: no dropout.
struct SdpaDropout {
  double p = 0.0;
  uint64_t seed = 0, stream = 0;
  int64_t row0 = 0;
};

// The same with document masks for packed sequences: doc_starts [B, N] (i64) lists, per
// batch row, the key positions where its documents start — ascending, the first 0, within
// [0, S]; a row with fewer documents pads with S (empty documents). Query i (at key position
// i + S - T) sees only keys of its own document (and, when causal, none after it). One list
// for the whole batch is an expand of a [1, N] tensor. An undefined doc_starts is one
// document per row. cp_method (ring | all_to_all, empty: ring) says how a call whose sequence
// is split over a mesh dim runs (context parallel; docs/attention.md); one rank ignores it.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc_starts,
                                    bool causal = false, double scale = 0.0, std::string_view cp_method = {},
                                    const SdpaDropout& dropout = {});

// ---- blocks of a longer sequence (ring attention, dist/ring_attention.cc) ----
// Where a block pair sits: query t at global position q0 + t, key j at k0 + j; the document
// starts (global, [B, N]) index a sequence of `total` positions. With dropout, the block's
// batch rows and heads start at global row b0 (after the dropout's row0) and head h0 of
// `heads` (0: q's own).
struct SdpaBlockPlace {
  int64_t q0 = 0, k0 = 0, total = 0;
  SdpaDropout dropout = {};
  int64_t b0 = 0, h0 = 0, heads = 0;
};
// {out [B, H, T, D], LSE [B, H, T]} of q [B, H, T, D] against the key/value block k, v
// [B, Hkv, S, D] alone (plain tensors, not recorded): partial results that merge by their LSE.
// A query that sees no key of the block gets out 0 and LSE -inf.
std::array<Tensor, 2> sdpa_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc_starts,
                                         bool causal, double scale, const SdpaBlockPlace& at);
// {dq, dk, dv} of the block pair given the merged out and LSE of the whole key range and dout:
// the probabilities rebuilt as e^(s - LSE) are the pair's share of the whole softmax, so the
// sums of these over every key block are the gradients of the whole attention.
std::array<Tensor, 3> sdpa_block_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                          const Tensor& lse, const Tensor& dout, const Tensor& doc_starts, bool causal,
                                          double scale, const SdpaBlockPlace& at);

}  // namespace tessel
