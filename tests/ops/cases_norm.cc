// Cases for norm.cc: layer_norm with weight and bias, either one, or neither; rms_norm with
// and without weight; rows longer than the vector lanes and 1-D inputs.
#include <cmath>

#include "op_cases.h"

namespace tessel::testing {

namespace {

// y[r, c] = (x[r, c] - mean_r) / sqrt(var_r + eps) · w[c] + b[c] (centred), or
// x[r, c] / sqrt(mean_r(x²) + eps) · w[c]; var is biased.
Tensor ref_norm(const Tensor& x, const Tensor* w, const Tensor* b, double eps, bool centred, int64_t ndim = 1) {
  Nd a(x), y(x.shape());
  Nd wn = w ? Nd(*w) : Nd(), bn = b ? Nd(*b) : Nd();
  int64_t C = 1;
  for (int64_t d = 0; d < ndim; ++d) C *= x.shape()[x.shape().size() - 1 - static_cast<size_t>(d)];
  int64_t R = C > 0 ? a.numel() / C : 0;
  for (int64_t r = 0; r < R; ++r) {
    double mean = 0, var = 0;
    if (centred) {
      for (int64_t c = 0; c < C; ++c) mean += a.v[r * C + c];
      mean /= static_cast<double>(C);
    }
    for (int64_t c = 0; c < C; ++c) var += (a.v[r * C + c] - mean) * (a.v[r * C + c] - mean);
    var /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) {
      double v = (a.v[r * C + c] - mean) / std::sqrt(var + eps);
      if (w) v *= wn.v[c];
      if (b) v += bn.v[c];
      y.v[r * C + c] = v;
    }
  }
  return y.tensor();
}

struct NormCase {
  const char* tag;
  Shape x;
  bool weight, bias;
  int64_t ndim = 1;  // layer_norm's normalized_ndim
};

}  // namespace

std::vector<OpCase> norm_cases() {
  std::vector<OpCase> out;
  // Over the last two dims first: the rule validator runs the first two cases of each op.
  for (const NormCase& n : {NormCase{"two_dims", {2, 3, 5}, true, true, 2}, NormCase{"affine", {2, 3, 5}, true, true},
                            NormCase{"plain", {3, 5}, false, false}, NormCase{"three_dims", {2, 3, 4}, false, true, 3},
                            NormCase{"weight_only", {3, 5}, true, false}, NormCase{"bias_only", {3, 5}, false, true},
                            NormCase{"long_rows", {3, 21}, true, true}, NormCase{"vector", {6}, true, true}}) {
    out.push_back(OpCase{
        .name = fmt::format("layer_norm/{}", n.tag),
        .op = "layer_norm",
        .make_inputs =
            [n](DType d) {
              Tensors in{rand_tensor(n.x, d, 41, -2.0, 2.0)};
              const Shape row(n.x.end() - n.ndim, n.x.end());
              if (n.weight) in.push_back(rand_tensor(row, d, 42, 0.5, 1.5));
              if (n.bias) in.push_back(rand_tensor(row, d, 43));
              return in;
            },
        .run =
            [n](const Tensors& in) {
              Tensor w = n.weight ? in[1] : Tensor();
              Tensor b = n.bias ? in[n.weight ? 2 : 1] : Tensor();
              return Tensors{layer_norm(in[0], w, b, 1e-5, n.ndim)};
            },
        .reference =
            [n](const Tensors& in) {
              const Tensor* w = n.weight ? &in[1] : nullptr;
              const Tensor* b = n.bias ? &in[n.weight ? 2 : 1] : nullptr;
              return Tensors{ref_norm(in[0], w, b, 1e-5, true, n.ndim)};
            },
        .f32_rtol = 1e-5,
        .f32_atol = 1e-5});
  }
  for (const NormCase& n : {NormCase{"weight", {2, 3, 5}, true, false}, NormCase{"plain", {3, 5}, false, false},
                            NormCase{"long_rows", {3, 21}, true, false}}) {
    out.push_back(OpCase{
        .name = fmt::format("rms_norm/{}", n.tag),
        .op = "rms_norm",
        .make_inputs =
            [n](DType d) {
              Tensors in{rand_tensor(n.x, d, 44, -2.0, 2.0)};
              if (n.weight) in.push_back(rand_tensor({n.x.back()}, d, 45, 0.5, 1.5));
              return in;
            },
        .run = [n](const Tensors& in) { return Tensors{rms_norm(in[0], n.weight ? in[1] : Tensor(), 1e-6)}; },
        .reference =
            [n](const Tensors& in) {
              return Tensors{ref_norm(in[0], n.weight ? &in[1] : nullptr, nullptr, 1e-6, false)};
            },
        .f32_rtol = 1e-5,
        .f32_atol = 1e-5});
  }
  return out;
}

std::vector<ErrorCase> norm_errors() {
  return {
      {"layer_norm_ndim_weight", [] { layer_norm(Tensor::zeros({2, 3, 4}), Tensor::ones({4}), {}, 1e-5, 2); },
       {"layer_norm", "weight", "f32[4]", "[3, 4]", "last 2 dim(s)"}},
      {"layer_norm_ndim", [] { layer_norm(Tensor::zeros({2, 4}), {}, {}, 1e-5, 3); },
       {"layer_norm", "normalized_ndim 3", "f32[2, 4]"}},
      {"layer_norm_weight", [] { layer_norm(Tensor::zeros({2, 4}), Tensor::ones({3})); },
       {"layer_norm", "weight", "f32[3]", "[4]", "f32[2, 4]"}},
      {"layer_norm_bias", [] { layer_norm(Tensor::zeros({2, 4}), Tensor::ones({4}), Tensor::zeros({2, 2})); },
       {"layer_norm", "bias", "f32[2, 2]", "f32[2, 4]"}},
      {"layer_norm_dtype", [] { layer_norm(Tensor::zeros({2, 4}), Tensor::ones({4}, DType::f64)); },
       {"layer_norm", "f32", "f64"}},
      {"layer_norm_int", [] { layer_norm(Tensor::zeros({2, 4}, DType::i32)); }, {"layer_norm", "i32"}},
      {"layer_norm_scalar", [] { layer_norm(Tensor::scalar(1.0)); }, {"layer_norm", "f32[]"}},
      {"rms_norm_weight", [] { rms_norm(Tensor::zeros({3, 5}), Tensor::ones({6})); },
       {"rms_norm", "weight", "f32[6]", "f32[3, 5]"}},
  };
}

}  // namespace tessel::testing
