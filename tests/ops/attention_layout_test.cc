// sdpa's gradients for the heads of a fused qkv projection are written into one buffer laid
// out like the projection, so split's backward passes them on whole instead of concatenating
// three copies; the values are those of the separate-tensor path.
#include <gtest/gtest.h>

#include "op_test_util.h"
#include "tessel/autograd/engine.h"
#include "tessel/core/profile.h"
#include "tessel/ops/ops.h"

namespace tessel::testing {
namespace {

constexpr int64_t B = 2, T = 6, H = 2, D = 4, C = H * D;

// [B, T, 3C] -> q, k, v as [B, H, T, D] views; `copy` makes each a separate contiguous tensor.
std::vector<Tensor> heads(const Tensor& x, bool copy) {
  std::vector<Tensor> out;
  for (const Tensor& p : split(x, {C, C, C}, -1)) {
    Tensor h = permute(reshape(p, {B, T, H, D}), {0, 2, 1, 3});
    out.push_back(copy ? contiguous(h) : h);
  }
  return out;
}

// x's gradient through sdpa, with the profile of the backward in `report`.
Tensor input_grad(bool copy, std::string* report) {
  Tensor x = rand_tensor({B, T, 3 * C}, DType::f32, 71, -1.5, 1.5).set_requires_grad();
  std::vector<Tensor> qkv = heads(x, copy);
  Tensor y = scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], true);
  Tensor gy = rand_tensor({B, H, T, D}, DType::f32, 72);
  profile_reset();
  set_profiling(true);
  backward(y, gy);
  set_profiling(false);
  *report = profile_report();
  profile_reset();
  return x.grad();
}

TEST(AttentionLayout, FusedQkvGradientsReachTheProjectionWithoutACat) {
  std::string fused_report, copied_report;
  Tensor fused = input_grad(false, &fused_report);
  Tensor copied = input_grad(true, &copied_report);
  EXPECT_NE(fused_report.find("split.backward"), std::string::npos) << fused_report;
  EXPECT_EQ(fused_report.find("\ncat "), std::string::npos) << "split's backward copied:\n" << fused_report;
  // The separate-tensor path still concatenates (the check above can fail).
  EXPECT_NE(copied_report.find("\ncat "), std::string::npos) << copied_report;
  EXPECT_EQ(compare(fused, copied, 1e-5, 1e-6), "");  // BLAS may round differently at other strides
}

}  // namespace
}  // namespace tessel::testing
