// The fused attention kernel against attention composed of the plain ops (matmul, add of a
// mask, softmax, matmul) in f32: outputs and gradients agree to a relative 1e-5, for causal,
// non-causal, grouped-query heads, T != S and document masks. Between its forward and backward
// it holds only out and one log-sum-exp per query row (linear in the sequence), a packed row
// with document starts gives what each document gives on its own, and outputs stored past the
// caches (large ones) hold the same bits as those stored as usual.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "op_test_util.h"
#include "tessel/autograd/engine.h"
#include "tessel/core/context.h"
#include "tessel/core/storage.h"
#include "tessel/ops/attention_kernel.h"
#include "tessel/ops/ops.h"

namespace tessel::testing {
namespace {

struct Case {
  const char* tag;
  Shape q, kv;
  bool causal;
  std::vector<std::vector<int64_t>> docs = {};  // document starts per batch row
};

// Every query sees at least one key (the composed softmax of a fully masked row is NaN).
const Case kCases[] = {
    {"causal", {2, 2, 150, 16}, {2, 2, 150, 16}, true},
    {"plain", {1, 3, 100, 16}, {1, 3, 100, 16}, false},
    {"gqa_causal", {1, 4, 130, 8}, {1, 2, 130, 8}, true},
    {"causal_t_lt_s", {1, 2, 70, 16}, {1, 2, 200, 16}, true},
    {"plain_t_gt_s", {1, 2, 140, 16}, {1, 2, 60, 16}, false},
    {"docs_causal", {2, 2, 160, 16}, {2, 2, 160, 16}, true, {{0, 10, 90, 160}, {0, 150, 160, 160}}},
    {"docs_plain_gqa", {1, 4, 130, 8}, {1, 2, 130, 8}, false, {{0, 64, 65}}},
};

Tensor doc_tensor(const std::vector<std::vector<int64_t>>& docs) {
  if (docs.empty()) return Tensor();
  std::vector<int64_t> flat;
  for (const auto& row : docs) flat.insert(flat.end(), row.begin(), row.end());
  return Tensor::from_vector(flat, {static_cast<int64_t>(docs.size()), static_cast<int64_t>(docs[0].size())});
}

// [B, 1, G·T, S]: 0 where query t (of any of the G heads of a group) sees key j, else -inf.
Tensor additive_mask(const Case& c, DType dtype) {
  const int64_t B = c.q[0], G = c.q[1] / c.kv[1], T = c.q[2], S = c.kv[2];
  Nd m({B, 1, G * T, S});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < S; ++j) {
          const int64_t p = t + S - T;
          bool seen = !c.causal || j <= p;
          if (!c.docs.empty()) {
            const auto& st = c.docs[static_cast<size_t>(b)];
            auto doc = [&st](int64_t x) { return std::upper_bound(st.begin(), st.end(), x) - st.begin(); };
            seen = seen && p >= 0 && doc(p) == doc(j);
          }
          m({b, 0, g * T + t, j}) = seen ? 0.0 : -INFINITY;
        }
  return m.tensor(dtype);
}

// softmax(q k^T · scale + mask) v from the plain ops: the G query heads of a kv head are
// consecutive in q, so [B, H, T, D] reshapes to [B, Hkv, G·T, D] against k's [B, Hkv, S, D].
Tensor composed(const Case& c, const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t B = c.q[0], H = c.q[1], Hkv = c.kv[1], T = c.q[2], D = c.q[3];
  Tensor qg = reshape(q, {B, Hkv, H / Hkv * T, D});
  Tensor s =
      add(scale(matmul(qg, k, false, true), 1.0 / std::sqrt(static_cast<double>(D))), additive_mask(c, q.dtype()));
  return reshape(matmul(softmax(s, -1), v), {B, H, T, D});
}

struct Pass {
  Tensor out;
  std::vector<Tensor> grads;
};

Pass run(const Case& c, bool fused) {
  std::vector<Tensor> in{rand_tensor(c.q, DType::f32, 61, -1.5, 1.5).set_requires_grad(),
                         rand_tensor(c.kv, DType::f32, 62, -1.5, 1.5).set_requires_grad(),
                         rand_tensor(c.kv, DType::f32, 63).set_requires_grad()};
  Pass r;
  r.out = fused ? scaled_dot_product_attention(in[0], in[1], in[2], doc_tensor(c.docs), c.causal)
                : composed(c, in[0], in[1], in[2]);
  backward(r.out, rand_tensor(c.q, DType::f32, 64));
  for (const Tensor& t : in) r.grads.push_back(t.grad());
  return r;
}

TEST(AttentionFused, MatchesAttentionComposedOfPlainOps) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.tag);
    Pass want = run(c, false), got = run(c, true);
    EXPECT_EQ(compare(got.out, want.out, 1e-5, 1e-6), "");
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(compare(got.grads[i], want.grads[i], 1e-5, 1e-6), "") << "gradient " << i;
  }
}

// Scores that grow along the keys, each key block's max above the first block's by ~10-20
// (slope 0.03) or ~30-50 (slope 0.08) in base 2: the forward's lazy path (the rows' earlier
// max kept as the base while a block's row sums stay at most 2^24) keeps blocks with large
// exponentials in the first case and falls back to rescaling in the second. The oracle is the
// composed softmax in f64: the fused kernel in f64 matches it to 1e-10; in f32, scores of up
// to ~100 carry a rounding of ~1e-5 into every exponential and the gradients meet keys of up
// to ~20, so the bound is 2e-4 relative or 4e-5 absolute (the kernel before the lazy path
// and the composed ops in f32 are off by as much: ~2e-5 on a dQ element of 0.036).
TEST(AttentionFused, ScoresGrowingAlongTheKeysMatchTheComposedSoftmax) {
  const Shape shape{1, 2, 256, 16};
  const std::vector<double> noise = rand_tensor(shape, DType::f64, 92, 0.9, 1.1).to_doubles();
  for (double slope : {0.03, 0.08})
    for (bool causal : {false, true}) {
      const Case c{"growing", shape, shape, causal};
      Nd kn(shape);  // k[j] = slope · j, each element within 10%
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t j = 0; j < 256; ++j)
          for (int64_t e = 0; e < 16; ++e)
            kn({0, h, j, e}) = slope * static_cast<double>(j) * noise[static_cast<size_t>((h * 256 + j) * 16 + e)];
      auto inputs = [&](DType dt) {
        return std::vector<Tensor>{rand_tensor(shape, dt, 91, 0.5, 1.5).set_requires_grad(),
                                   kn.tensor(dt).set_requires_grad(), rand_tensor(shape, dt, 93).set_requires_grad()};
      };
      std::vector<Tensor> want = inputs(DType::f64);
      Tensor y = composed(c, want[0], want[1], want[2]);
      backward(y, rand_tensor(shape, DType::f64, 94));
      for (DType dt : {DType::f64, DType::f32}) {
        SCOPED_TRACE(fmt::format("slope {}, {}, {}", slope, causal ? "causal" : "plain", dtype_name(dt)));
        const double rtol = dt == DType::f64 ? 1e-10 : 2e-4, atol = dt == DType::f64 ? 1e-11 : 4e-5;
        std::vector<Tensor> got = inputs(dt);
        Tensor out = scaled_dot_product_attention(got[0], got[1], got[2], causal);
        backward(out, rand_tensor(shape, dt, 94));
        EXPECT_EQ(compare(cast(out, DType::f64), y, rtol, atol), "");
        for (size_t i = 0; i < 3; ++i)
          EXPECT_EQ(compare(cast(got[i].grad(), DType::f64), want[i].grad(), rtol, atol), "") << "gradient " << i;
      }
    }
}

// Bytes the forward allocates that are still alive when the backward starts: out [B, H, T, D]
// and the log-sum-exp [B, H, T] — nothing of size T×S, at any T.
TEST(AttentionFused, KeepsOnlyTheOutputAndOneLogSumExpPerRow) {
  for (int64_t T : {256, 1024}) {
    const int64_t B = 1, H = 2, D = 16;
    Tensor q = rand_tensor({B, H, T, D}, DType::f32, 71).set_requires_grad();
    Tensor k = rand_tensor({B, H, T, D}, DType::f32, 72).set_requires_grad();
    Tensor v = rand_tensor({B, H, T, D}, DType::f32, 73).set_requires_grad();
    MemoryStats& mem = *rank_context().memory;
    const int64_t before = mem.current.load();
    Tensor y = scaled_dot_product_attention(q, k, v, true);
    EXPECT_EQ(mem.current.load() - before, (B * H * T * D + B * H * T) * 4) << "T=" << T;
    backward(y, rand_tensor(y.shape(), DType::f32, 74));
    EXPECT_TRUE(q.grad().defined());
  }
}

// Outputs of kStreamBytes and more (out, dK, dV) are stored past the caches; each batch row run
// alone stays below it and is stored as usual: the same bits.
TEST(AttentionFused, OutputsStoredPastTheCachesMatchThoseStoredAsUsual) {
  const int64_t B = 32, H = 4, T = 256, D = 64;
  ASSERT_GE(B * H * T * D * 4, attention_kernel::kStreamBytes);
  ASSERT_LT(H * T * D * 4, attention_kernel::kStreamBytes);
  std::vector<Tensor> in{rand_tensor({B, H, T, D}, DType::f32, 101, -1.5, 1.5).set_requires_grad(),
                         rand_tensor({B, H, T, D}, DType::f32, 102, -1.5, 1.5).set_requires_grad(),
                         rand_tensor({B, H, T, D}, DType::f32, 103).set_requires_grad()};
  Tensor gy = rand_tensor({B, H, T, D}, DType::f32, 104);
  Tensor whole = scaled_dot_product_attention(in[0], in[1], in[2], true);
  backward(whole, gy);
  for (int64_t b = 0; b < B; b += 7) {
    std::vector<Tensor> row;
    for (const Tensor& t : in) row.push_back(contiguous(slice(t.detach(), 0, b, b + 1)).set_requires_grad());
    Tensor alone = scaled_dot_product_attention(row[0], row[1], row[2], true);
    backward(alone, contiguous(slice(gy, 0, b, b + 1)));
    EXPECT_EQ(slice(whole.detach(), 0, b, b + 1).to_doubles(), alone.to_doubles()) << "batch row " << b;
    for (size_t i = 0; i < 3; ++i)
      EXPECT_EQ(slice(in[i].grad(), 0, b, b + 1).to_doubles(), row[i].grad().to_doubles())
          << "batch row " << b << ", gradient " << i;
  }
}

// One packed row of three documents against each document run as its own sequence.
TEST(AttentionFused, PackedDocumentsMatchEachDocumentAlone) {
  const std::vector<int64_t> starts{0, 40, 45, 170};
  const int64_t H = 2, T = 200, D = 8;
  for (bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "plain");
    std::vector<Tensor> in{rand_tensor({1, H, T, D}, DType::f32, 81, -1.5, 1.5).set_requires_grad(),
                           rand_tensor({1, H, T, D}, DType::f32, 82, -1.5, 1.5).set_requires_grad(),
                           rand_tensor({1, H, T, D}, DType::f32, 83).set_requires_grad()};
    Tensor gy = rand_tensor({1, H, T, D}, DType::f32, 84);
    Tensor packed = scaled_dot_product_attention(in[0], in[1], in[2], doc_tensor({starts}), causal);
    backward(packed, gy);
    for (size_t d = 0; d < starts.size(); ++d) {
      const int64_t lo = starts[d], hi = d + 1 < starts.size() ? starts[d + 1] : T;
      std::vector<Tensor> part;
      for (const Tensor& t : in) part.push_back(contiguous(slice(t.detach(), 2, lo, hi)).set_requires_grad());
      Tensor alone = scaled_dot_product_attention(part[0], part[1], part[2], causal);
      backward(alone, contiguous(slice(gy, 2, lo, hi)));
      EXPECT_EQ(compare(slice(packed.detach(), 2, lo, hi), alone, 1e-5, 1e-6), "") << "document " << d;
      for (size_t i = 0; i < 3; ++i)
        EXPECT_EQ(compare(slice(in[i].grad(), 2, lo, hi), part[i].grad(), 1e-5, 1e-6), "")
            << "document " << d << ", gradient " << i;
    }
  }
}

}  // namespace
}  // namespace tessel::testing
