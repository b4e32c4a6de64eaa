// sdpa with recompute_probs (selective activation recompute) keeps no [B, H, T, S]
// probabilities between its forward and backward, and rebuilds them in the backward with the
// forward's kernels in the forward's order: its output and its gradients are the same bits as
// those of the path that keeps them, and the bytes held between the two passes shrink by
// exactly B·H·T·S values.
#include <gtest/gtest.h>

#include <cstring>

#include "op_test_util.h"
#include "tessel/autograd/engine.h"
#include "tessel/core/context.h"
#include "tessel/core/storage.h"
#include "tessel/ops/ops.h"

namespace tessel::testing {
namespace {

struct Case {
  const char* tag;
  Shape q, kv;
  bool causal;
  bool fused = false;  // q, k, v as heads of one [B, T, 3·H·D] projection (GPT-2's c_attn)
};

const Case kCases[] = {
    {"causal_blocks", {2, 2, 70, 8}, {2, 2, 70, 8}, true},
    {"causal_gqa", {1, 4, 40, 4}, {1, 2, 40, 4}, true},
    {"causal_t_gt_s", {1, 2, 80, 3}, {1, 2, 40, 3}, true},  // blocks of queries that see no key
    {"causal_t_lt_s", {1, 1, 40, 5}, {1, 1, 72, 5}, true},
    {"plain", {2, 3, 9, 19}, {2, 3, 13, 19}, false},
    {"fused_causal", {2, 4, 50, 8}, {2, 4, 50, 8}, true, true},
};

bool same_bits(const Tensor& a, const Tensor& b) {
  Tensor x = contiguous(a), y = contiguous(b);
  return x.shape() == y.shape() && x.dtype() == y.dtype() &&
         std::memcmp(x.data<float>(), y.data<float>(), static_cast<size_t>(x.numel()) * sizeof(float)) == 0;
}

struct Pass {
  Tensor out;
  std::vector<Tensor> grads;
  int64_t held = 0;  // bytes allocated by the forward and still alive when the backward starts
};

Pass run(const Case& c, bool recompute) {
  std::vector<Tensor> leaves, qkv;
  if (c.fused) {
    const int64_t B = c.q[0], H = c.q[1], T = c.q[2], D = c.q[3];
    Tensor x = rand_tensor({B, T, 3 * H * D}, DType::f32, 81, -1.5, 1.5).set_requires_grad();
    leaves.push_back(x);
    for (const Tensor& p : split(x, {H * D, H * D, H * D}, -1))
      qkv.push_back(permute(reshape(p, {B, T, H, D}), {0, 2, 1, 3}));
  } else {
    leaves = {rand_tensor(c.q, DType::f32, 82, -1.5, 1.5).set_requires_grad(),
              rand_tensor(c.kv, DType::f32, 83, -1.5, 1.5).set_requires_grad(),
              rand_tensor(c.kv, DType::f32, 84).set_requires_grad()};
    qkv = leaves;
  }
  Tensor gy = rand_tensor(c.q, DType::f32, 85);
  MemoryStats& mem = *rank_context().memory;
  const int64_t before = mem.current.load();
  Pass r;
  r.out = scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], c.causal, 0.0, recompute);
  r.held = mem.current.load() - before;
  backward(r.out, gy);
  for (const Tensor& l : leaves) r.grads.push_back(l.grad());
  return r;
}

TEST(AttentionRecompute, SameBitsAsKeepingTheProbabilities) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.tag);
    Pass kept = run(c, false), rebuilt = run(c, true);
    EXPECT_TRUE(same_bits(kept.out, rebuilt.out));
    ASSERT_EQ(kept.grads.size(), rebuilt.grads.size());
    for (size_t i = 0; i < kept.grads.size(); ++i) {
      ASSERT_TRUE(rebuilt.grads[i].defined());
      EXPECT_TRUE(same_bits(kept.grads[i], rebuilt.grads[i])) << "gradient " << i << ": "
                                                              << compare(rebuilt.grads[i], kept.grads[i], 0, 0);
    }
    // The kept path holds P [B, H, T, S] in f32 on top of the output; the other does not.
    const int64_t probs = c.q[0] * c.q[1] * c.q[2] * c.kv[2] * 4;
    EXPECT_EQ(kept.held - rebuilt.held, probs) << "kept " << kept.held << " B, rebuilt " << rebuilt.held << " B";
  }
}

TEST(AttentionRecompute, OnlyTheGradientsAskedFor) {
  // dV alone and dQ alone take other branches of the backward; both must still rebuild P.
  const Case c{"gqa", {1, 4, 40, 4}, {1, 2, 40, 4}, true};
  Tensor q = rand_tensor(c.q, DType::f32, 91, -1.5, 1.5), k = rand_tensor(c.kv, DType::f32, 92, -1.5, 1.5),
         v = rand_tensor(c.kv, DType::f32, 93);
  Tensor gy = rand_tensor(c.q, DType::f32, 94);
  for (int which : {0, 2}) {
    Tensor grads[2];
    for (bool recompute : {false, true}) {
      Tensor in[3] = {q.detach(), k.detach(), v.detach()};
      in[which].set_requires_grad();
      backward(scaled_dot_product_attention(in[0], in[1], in[2], true, 0.0, recompute), gy);
      grads[recompute ? 1 : 0] = in[which].grad();
    }
    EXPECT_TRUE(same_bits(grads[0], grads[1])) << "input " << which;
  }
}

}  // namespace
}  // namespace tessel::testing
