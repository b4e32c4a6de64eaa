// Cases for attention.cc: scaled_dot_product_attention non-causal and causal with T == S,
// T < S (causal offset S - T) and T > S (queries that see no key), grouped-query heads (also
// with batch 2 and head counts that split unevenly), an explicit scale, and a non-contiguous q
// made by permuting [B, T, H, D], q, k and v as the heads of one fused projection, and one
// tensor passed as all three; and document masks (packed sequences: documents of one row
// that must not see each other, causal or not, with T != S, empty documents and blocks of
// keys entirely in other documents); and dropout on the probabilities (the reference drops
// P[b, h, t, j] where the documented Philox word of its index ((b·H + h)·T + t)·S + j is below
// p·2^32), also with documents, grouped heads and several blocks.
#include <algorithm>
#include <cmath>

#include "op_cases.h"
#include "tessel/core/philox.h"

namespace tessel::testing {

namespace {

// out[b, h, t, :] = Σ_j p_j v[b, h / (H / Hkv), j, :] with p = softmax over visible keys j of
// scale · q[b, h, t, :] · k[b, kvh, j, :]; a query with no visible key gives 0. docs[b] (empty:
// one document) lists where the documents of row b start: query t, at key position
// p = t + S - T, sees key j only when both lie in the same document. With dropout, p_j is
// zeroed where the Philox word of its global index is below p·2^32 and scaled by 1/(1-p) elsewhere.
constexpr uint64_t kDropSeed = 1234, kDropStream = 77;
Tensor ref_sdpa(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                const std::vector<std::vector<int64_t>>& docs = {}, double dropout = 0.0) {
  Nd qn(q), kn(k), vn(v);
  int64_t B = q.shape()[0], H = q.shape()[1], T = q.shape()[2], D = q.shape()[3];
  int64_t Hkv = k.shape()[1], S = k.shape()[2];
  if (scale == 0) scale = 1.0 / std::sqrt(static_cast<double>(D));
  Nd out(q.shape());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        int64_t kvh = h / (H / Hkv);
        std::vector<double> s(static_cast<size_t>(S), -INFINITY);
        double m = -INFINITY;
        for (int64_t j = 0; j < S; ++j) {
          if (causal && j > t + (S - T)) continue;
          if (!docs.empty()) {
            const std::vector<int64_t>& st = docs[static_cast<size_t>(b)];
            auto doc_of = [&st](int64_t pos) { return std::upper_bound(st.begin(), st.end(), pos) - st.begin(); };
            const int64_t p = t + S - T;
            if (p < 0 || doc_of(p) != doc_of(j)) continue;
          }
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += qn({b, h, t, d}) * kn({b, kvh, j, d});
          s[j] = dot * scale;
          m = std::max(m, s[j]);
        }
        if (m == -INFINITY) continue;  // no visible key
        double z = 0;
        for (int64_t j = 0; j < S; ++j) z += std::exp(s[j] - m);
        std::vector<double> keep(static_cast<size_t>(S), 1.0);
        for (int64_t j = 0; j < S && dropout > 0; ++j) {
          const auto at = static_cast<uint64_t>(((b * H + h) * T + t) * S + j);
          const bool dropped = philox_at(kDropSeed, kDropStream, at / 4)[at % 4] < dropout * 4294967296.0;
          keep[static_cast<size_t>(j)] = dropped ? 0.0 : 1.0 / (1.0 - dropout);
        }
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < S; ++j)
            acc += std::exp(s[j] - m) / z * keep[static_cast<size_t>(j)] * vn({b, kvh, j, d});
          out({b, h, t, d}) = acc;
        }
      }
  return out.tensor();
}

struct SdpaCase {
  const char* tag;
  Shape q, kv;
  bool causal;
  double scale = 0.0;
  std::vector<std::vector<int64_t>> docs = {};  // document starts per batch row (empty: none)
  double dropout = 0.0;                         // on the probabilities
};
// The rule validator runs the first two: grouped-query heads that split unevenly (H=6 over
// Hkv=3 keeps its groups on 3 ranks, not on 2 or 4), batch 2, causal with T < S; and document
// starts (a fourth input, sharded with the batch) with grouped heads and dropout (each piece
// draws its mask at its global batch row and head).
const SdpaCase kSdpaCases[] = {
    {"gqa_uneven_causal", {2, 6, 3, 2}, {2, 3, 4, 2}, true},
    {"dropout_docs_gqa_causal_batch", {2, 4, 5, 2}, {2, 2, 5, 2}, true, 0.0, {{0, 2, 5}, {0, 4, 4}}, 0.3},
    {"docs_gqa_causal_batch", {2, 4, 5, 2}, {2, 2, 5, 2}, true, 0.0, {{0, 2, 5}, {0, 4, 4}}},
    {"gqa_causal", {1, 4, 3, 2}, {1, 2, 3, 2}, true},
    {"plain", {1, 2, 3, 4}, {1, 2, 3, 4}, false},
    {"causal", {1, 2, 3, 4}, {1, 2, 3, 4}, true},
    {"t_lt_s", {2, 1, 2, 3}, {2, 1, 4, 3}, false},
    {"causal_t_lt_s", {1, 2, 2, 4}, {1, 2, 4, 4}, true},
    {"causal_t_gt_s", {1, 1, 4, 3}, {1, 1, 2, 3}, true},
    {"gqa", {1, 4, 2, 3}, {1, 2, 3, 3}, false},
    {"scale", {1, 1, 3, 4}, {1, 1, 5, 4}, false, 0.7},
    // Longer than the kernel's causal query block (32), so the blocked path runs: a partial
    // last block, blocks that see no key at all (T > S), and keys beyond every query (T < S).
    {"causal_blocks", {1, 2, 70, 2}, {1, 2, 70, 2}, true},
    {"causal_blocks_gqa", {1, 4, 40, 2}, {1, 2, 40, 2}, true},
    {"causal_blocks_t_gt_s", {1, 1, 80, 2}, {1, 1, 40, 2}, true},
    {"causal_blocks_t_lt_s", {1, 1, 40, 2}, {1, 1, 72, 2}, true},
    {"plain_long", {1, 1, 40, 2}, {1, 1, 40, 2}, false},
    // Head dims wider than a vector of the products' tiles (with a remainder), so every
    // product — scores, P·V and the four of backward — runs on full tiles and on the tail.
    {"wide_heads_causal_gqa", {1, 4, 37, 20}, {1, 2, 37, 20}, true},
    {"wide_heads", {2, 1, 9, 19}, {2, 1, 13, 19}, false},
    // Longer than a key block (64) and a query block (64): several of each, partial last ones.
    {"causal_two_blocks_gqa", {1, 2, 130, 3}, {1, 1, 130, 3}, true},
    {"plain_two_blocks_t_lt_s", {1, 1, 20, 3}, {1, 1, 150, 3}, false},
    // Document masks: rows with different documents (padded with S: empty documents), causal
    // and not, grouped heads, T < S (queries at the end of the keys) and T > S (queries
    // before the first key belong to no document).
    {"docs_causal", {2, 2, 9, 3}, {2, 2, 9, 3}, true, 0.0, {{0, 3, 4, 9}, {0, 6, 9, 9}}},
    {"docs_plain_gqa", {2, 4, 7, 3}, {2, 2, 7, 3}, false, 0.0, {{0, 2, 5}, {0, 7, 7}}},
    {"docs_causal_t_lt_s", {1, 2, 4, 3}, {1, 2, 9, 3}, true, 0.0, {{0, 4, 7}}},
    {"docs_plain_t_gt_s", {1, 1, 6, 3}, {1, 1, 4, 3}, false, 0.0, {{0, 1}}},
    // Blocks of keys entirely in other documents are skipped (one long document after two
    // short ones, longer than a block each way).
    {"docs_causal_blocks", {1, 2, 150, 2}, {1, 2, 150, 2}, true, 0.0, {{0, 5, 70, 140}}},
    {"docs_plain_blocks_gqa", {1, 2, 140, 2}, {1, 1, 140, 2}, false, 0.0, {{0, 66, 66, 130}}},
    // Dropout: fully visible block pairs and the causal diagonal's partial ones, grouped heads,
    // T < S, a wide head dim, documents across blocks.
    {"dropout_causal_two_blocks_gqa", {1, 2, 130, 3}, {1, 1, 130, 3}, true, 0.0, {}, 0.2},
    {"dropout_plain_t_lt_s", {1, 1, 20, 3}, {1, 1, 150, 3}, false, 0.0, {}, 0.5},
    {"dropout_wide_heads_causal_gqa", {1, 4, 70, 20}, {1, 2, 70, 20}, true, 0.0, {}, 0.1},
    {"dropout_docs_causal_blocks", {1, 2, 150, 2}, {1, 2, 150, 2}, true, 0.0, {{0, 5, 70, 140}}, 0.25},
};

}  // namespace

std::vector<OpCase> attention_cases() {
  std::vector<OpCase> out;
  for (const SdpaCase& s : kSdpaCases) {
    out.push_back(OpCase{
        .name = fmt::format("sdpa/{}", s.tag),
        .op = "sdpa",
        .make_inputs =
            [s](DType d) {
              Tensors in{rand_tensor(s.q, d, 51, -1.5, 1.5), rand_tensor(s.kv, d, 52, -1.5, 1.5),
                         rand_tensor(s.kv, d, 53)};
              if (!s.docs.empty()) {
                std::vector<int64_t> flat;
                for (const auto& row : s.docs) flat.insert(flat.end(), row.begin(), row.end());
                in.push_back(Tensor::from_vector(flat, {static_cast<int64_t>(s.docs.size()),
                                                        static_cast<int64_t>(s.docs[0].size())}));
              }
              return in;
            },
        .run =
            [s](const Tensors& in) {
              const SdpaDropout drop{s.dropout, kDropSeed, kDropStream, 0};
              if (in.size() == 4)
                return Tensors{scaled_dot_product_attention(in[0], in[1], in[2], in[3], s.causal, s.scale, {}, drop)};
              if (s.dropout > 0)
                return Tensors{
                    scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), s.causal, s.scale, {}, drop)};
              return Tensors{scaled_dot_product_attention(in[0], in[1], in[2], s.causal, s.scale)};
            },
        .reference =
            [s](const Tensors& in) {
              return Tensors{ref_sdpa(in[0], in[1], in[2], s.causal, s.scale, s.docs, s.dropout)};
            },
        .f32_rtol = 1e-4,
        .f32_atol = 1e-5});
  }
  // q arrives as [B, T, H, D] and is permuted to [B, H, T, D]: a strided view, not a copy.
  out.push_back(OpCase{
      .name = "sdpa/permuted_q",
      .op = "sdpa",
      .make_inputs =
          [](DType d) {
            return Tensors{rand_tensor({1, 3, 2, 4}, d, 54, -1.5, 1.5), rand_tensor({1, 2, 3, 4}, d, 55, -1.5, 1.5),
                           rand_tensor({1, 2, 3, 4}, d, 56)};
          },
      .run = TESSEL_RUN1(scaled_dot_product_attention(permute(in[0], {0, 2, 1, 3}), in[1], in[2], true)),
      .reference =
          [](const Tensors& in) {
            Tensor q = contiguous(permute(in[0], {0, 2, 1, 3}));
            return Tensors{ref_sdpa(q, in[1], in[2], true, 0.0)};
          },
      .f32_rtol = 1e-4,
      .f32_atol = 1e-5});
  // q, k and v as the heads of one fused projection x [B, T, 3·H·D] (GPT-2's c_attn): the
  // backward writes their gradients into one buffer laid out like x, which split's backward
  // takes whole (attention_layout_test checks that no copy is made).
  auto fused_heads = [](const Tensor& x, int64_t H) {
    const int64_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2] / 3;
    std::vector<Tensor> parts = split(x, {C, C, C}, -1);
    Tensors heads;
    for (const Tensor& p : parts) heads.push_back(permute(reshape(p, {B, T, H, C / H}), {0, 2, 1, 3}));
    return heads;
  };
  for (bool causal : {true, false}) {
    out.push_back(OpCase{
        .name = causal ? "sdpa/fused_qkv_causal" : "sdpa/fused_qkv",
        .op = "sdpa",
        .make_inputs = [](DType d) { return Tensors{rand_tensor({2, 5, 12}, d, 57, -1.5, 1.5)}; },
        .run =
            [fused_heads, causal](const Tensors& in) {
              Tensors h = fused_heads(in[0], 2);
              return Tensors{scaled_dot_product_attention(h[0], h[1], h[2], causal)};
            },
        .reference =
            [fused_heads, causal](const Tensors& in) {
              Tensors h = fused_heads(in[0], 2);
              return Tensors{ref_sdpa(contiguous(h[0]), contiguous(h[1]), contiguous(h[2]), causal, 0.0)};
            },
        .f32_rtol = 1e-4,
        .f32_atol = 1e-5});
  }
  // One tensor as q, k and v: the three gradients must not share a buffer.
  out.push_back(OpCase{
      .name = "sdpa/same_tensor_qkv",
      .op = "sdpa",
      .make_inputs = [](DType d) { return Tensors{rand_tensor({1, 2, 4, 3}, d, 58, -1.5, 1.5)}; },
      .run = TESSEL_RUN1(scaled_dot_product_attention(in[0], in[0], in[0], true)),
      .reference = [](const Tensors& in) { return Tensors{ref_sdpa(in[0], in[0], in[0], true, 0.0)}; },
      .f32_rtol = 1e-4,
      .f32_atol = 1e-5});
  return out;
}

std::vector<ErrorCase> attention_errors() {
  auto z = [](Shape s) { return Tensor::zeros(s); };
  return {
      {"sdpa_gqa_heads", [z] { scaled_dot_product_attention(z({1, 3, 2, 4}), z({1, 2, 2, 4}), z({1, 2, 2, 4})); },
       {"sdpa", "H=3", "Hkv=2", "[1, 3, 2, 4]", "[1, 2, 2, 4]"}},
      {"sdpa_batch", [z] { scaled_dot_product_attention(z({2, 2, 2, 4}), z({1, 2, 2, 4}), z({1, 2, 2, 4})); },
       {"sdpa", "B=2", "B=1", "[2, 2, 2, 4]", "[1, 2, 2, 4]"}},
      {"sdpa_head_dim", [z] { scaled_dot_product_attention(z({1, 2, 2, 4}), z({1, 2, 2, 3}), z({1, 2, 2, 3})); },
       {"sdpa", "D=4", "D=3"}},
      {"sdpa_kv_len", [z] { scaled_dot_product_attention(z({1, 2, 2, 4}), z({1, 2, 5, 4}), z({1, 2, 3, 4})); },
       {"sdpa", "[1, 2, 5, 4]", "[1, 2, 3, 4]"}},
      {"sdpa_ndim", [z] { scaled_dot_product_attention(z({2, 2, 4}), z({1, 2, 2, 4}), z({1, 2, 2, 4})); },
       {"sdpa", "4 dims", "[2, 2, 4]"}},
      {"sdpa_dtype",
       [z] { scaled_dot_product_attention(z({1, 2, 2, 4}), Tensor::zeros({1, 2, 2, 4}, DType::f64), z({1, 2, 2, 4})); },
       {"sdpa", "f32", "f64"}},
      {"sdpa_docs_dtype",
       [z] { scaled_dot_product_attention(z({1, 2, 2, 4}), z({1, 2, 2, 4}), z({1, 2, 2, 4}), z({1, 1})); },
       {"sdpa", "document starts", "i64", "f32"}},
      {"sdpa_docs_shape",
       [z] {
         scaled_dot_product_attention(z({2, 2, 2, 4}), z({2, 2, 2, 4}), z({2, 2, 2, 4}),
                                      Tensor::zeros({1, 2}, DType::i64));
       },
       {"sdpa", "document starts", "B=2", "[1, 2]"}},
      {"sdpa_docs_first",
       [z] {
         scaled_dot_product_attention(z({1, 1, 4, 2}), z({1, 1, 4, 2}), z({1, 1, 4, 2}),
                                      Tensor::from_vector<int64_t>({1, 2}, {1, 2}));
       },
       {"sdpa", "batch row 0", "begin at 0", "got 1"}},
      {"sdpa_docs_order",
       [z] {
         scaled_dot_product_attention(z({2, 1, 4, 2}), z({2, 1, 4, 2}), z({2, 1, 4, 2}),
                                      Tensor::from_vector<int64_t>({0, 2, 4, 0, 3, 1}, {2, 3}));
       },
       {"sdpa", "batch row 1", "ascending", "S=4", "start 2 is 1 after 3"}},
      {"sdpa_docs_beyond",
       [z] {
         scaled_dot_product_attention(z({1, 1, 4, 2}), z({1, 1, 4, 2}), z({1, 1, 4, 2}),
                                      Tensor::from_vector<int64_t>({0, 5}, {1, 2}));
       },
       {"sdpa", "batch row 0", "S=4", "5 after 0"}},
  };
}

}  // namespace tessel::testing
