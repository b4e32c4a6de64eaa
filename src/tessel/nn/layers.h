// Building blocks of transformer language models, each a Module whose forward is written
// with the differentiable ops of tessel/ops (so the same code runs on plain and, later,
// distributed tensors).
//
// Dims: B batch, T sequence, C model width, H heads, Hkv key/value heads, D head width.
#pragma once

#include "tessel/nn/module.h"
#include "tessel/ops/attention.h"

namespace tessel::nn {

// Dropout randomness of the calling rank: the seed, the training step, and where the
// current micro-batch's rows sit in the global batch — so a mask depends only on (seed,
// step, module, global element), never on how the batch was split.
struct DropoutState {
  uint64_t seed = 0;
  uint64_t step = 0;
  int64_t global_rows = 0;  // rows of the global batch (0: the input is the whole batch)
  int64_t row_offset = 0;   // first global row of the current input
};
DropoutState& dropout_state();

// How the calling rank's current micro-batch lays out its sequence, for the layers that need
// positions (GPT-2's learned positions, Llama's RoPE) and attention. Set by the engine beside
// the dropout state; the defaults are one ordinary sequence per row.
struct SequenceState {
  // [B, T] i64, like the token ids: the position of each token (context parallel's
  // load-balanced order holds the tokens out of order). Undefined: 0, 1, ..., T - 1.
  Tensor positions;
  // [B, N] i64: where each row's documents start (packed documents; sdpa's document starts).
  // Undefined: one document per row.
  Tensor doc_starts;
  // How attention runs when the sequence is split over a mesh dim (parallel.cp_method).
  std::string cp_method = "ring";
};
SequenceState& sequence_state();

// y = x @ W + b with W stored [out, in] (PyTorch/Llama) or [in, out] (GPT-2's Conv1D).
class Linear : public Module {
 public:
  enum class Layout { out_in, in_out };
  Linear(int64_t in, int64_t out, bool bias, Layout layout, double init_std);
  // Several output dims, [in, O1, O2, ...] layout: y[..., O1, O2, ...]. Checkpoint files keep
  // the Conv1D matrix [in, O1·O2·...] and bias [O1·O2·...] (the same bytes).
  Linear(int64_t in, const Shape& out, bool bias, double init_std);
  Tensor forward(const Tensor& x) const;
  Parameter& weight() { return *weight_; }
  Parameter* bias() { return bias_; }
  Layout layout() const { return layout_; }

 private:
  Parameter* weight_;
  Parameter* bias_ = nullptr;
  Layout layout_;
};

class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim, double init_std);
  Tensor forward(const Tensor& ids) const;  // [...] -> [..., dim]
  Parameter& weight() { return *weight_; }
  const Parameter& weight() const { return *weight_; }

 private:
  Parameter* weight_;
};

class LayerNorm : public Module {
 public:
  LayerNorm(int64_t dim, double eps);
  Tensor forward(const Tensor& x) const;

 private:
  Parameter* weight_;
  Parameter* bias_;
  double eps_;
};

class RMSNorm : public Module {
 public:
  RMSNorm(int64_t dim, double eps);
  Tensor forward(const Tensor& x) const;

 private:
  Parameter* weight_;
  double eps_;
};

// Drops elements with probability p in training mode (layout-invariant, see DropoutState).
class Dropout : public Module {
 public:
  explicit Dropout(double p) : p_(p) {}
  Tensor forward(const Tensor& x) const;

 private:
  double p_;
};

// GPT-2 MLP: c_proj(gelu_tanh(c_fc(x))), Conv1D layout, 4C hidden.
class Mlp : public Module {
 public:
  Mlp(int64_t dim, int64_t hidden, double init_std, double proj_std);
  Tensor forward(const Tensor& x) const;

 private:
  Linear* c_fc_;
  Linear* c_proj_;
};

// Llama MLP: down_proj(silu(gate_proj(x)) * up_proj(x)).
class SwiGlu : public Module {
 public:
  SwiGlu(int64_t dim, int64_t hidden, double init_std);
  Tensor forward(const Tensor& x) const;

 private:
  Linear* gate_;
  Linear* up_;
  Linear* down_;
};

// Rotary position embedding tables (Hugging Face Llama's rotate-half convention).
struct Rope {
  Tensor cos, sin;  // [T, D]
  static Rope make(int64_t seq_len, int64_t head_dim, double theta, DType dtype);
};
// x[B, H, T, D] -> x·cos + rotate_half(x)·sin, rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2]),
// the tables' rows at `positions` [B, T] (undefined: rows 0 .. T-1).
Tensor apply_rope(const Tensor& x, const Rope& rope, const Tensor& positions = Tensor());

// Causal attention of q [B, H, T, D] with k, v [B, Hkv, T, D] as the sequence state says: with
// the sequence split over a mesh dim (context parallel), by ring attention or by heads after an
// all_to_all, the output resharded back to q's sequence split. `dropout` drops probabilities
// (layout-invariant; ops/attention.h).
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool recompute_probs,
                        const SdpaDropout& dropout = {});

// GPT-2 attention: fused qkv projection (c_attn), causal multi-head attention, c_proj.
// c_attn's weight is [C, 3, C] (bias [3, C]): Hugging Face's [C, 3C] with q, k, v on their own
// dim, so sharding its last dim over tp gives each rank the q, k and v columns of its heads.
class Gpt2Attention : public Module {
 public:
  // attn_pdrop: dropout on the attention probabilities in training mode.
  Gpt2Attention(int64_t dim, int64_t heads, double init_std, double proj_std, double attn_pdrop = 0.0);
  Tensor forward(const Tensor& x) const;  // [B, T, C] -> [B, T, C]
  // Selective recompute: keep no [B, H, T, T] probabilities for the backward, rebuild them there.
  void set_recompute_probs(bool on) { recompute_probs_ = on; }

 private:
  int64_t heads_;
  double attn_pdrop_;
  bool recompute_probs_ = false;
  Linear* c_attn_;
  Linear* c_proj_;
};

// Llama attention: q/k/v/o projections, grouped-query heads, RoPE, causal.
class LlamaAttention : public Module {
 public:
  LlamaAttention(int64_t dim, int64_t heads, int64_t kv_heads, double init_std);
  Tensor forward(const Tensor& x, const Rope& rope) const;
  // Selective recompute: keep no [B, H, T, T] probabilities for the backward, rebuild them there.
  void set_recompute_probs(bool on) { recompute_probs_ = on; }

 private:
  int64_t heads_, kv_heads_, head_dim_;
  bool recompute_probs_ = false;
  Linear* q_;
  Linear* k_;
  Linear* v_;
  Linear* o_;
};

}  // namespace tessel::nn
