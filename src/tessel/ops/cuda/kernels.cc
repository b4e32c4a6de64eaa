// The ops' CUDA kernels: tensor-level glue (shapes, strides, outputs) around the launches of
// elementwise.cu and the cuBLASLt GEMMs of gemm.cc, and their registration. Ops whose
// kernels only make views or copy (shape ops, cast) run on the GPU as they are: their copies
// dispatch to the backend's strided-copy kernel.
#include "tessel/ops/cuda/kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string_view>

#include "tessel/core/cuda/cuda_device.h"
#include "tessel/core/view.h"
#include "tessel/ops/cuda/gemm.h"
#include "tessel/ops/cuda/launch.h"
#include "tessel/ops/device_fns.h"
#include "tessel/ops/op_list.h"
#include "tessel/ops/registry.h"

namespace tessel::cuda {

namespace {

int code_of(const Tensor& t, std::string_view op) {
  TESSEL_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64, "{} on CUDA: dtype {} (expected f32 or f64)", op,
               dtype_name(t.dtype()));
  return static_cast<int>(t.dtype());
}

template <Binary kOp>
std::vector<Tensor> binary_forward(const OpCall& c) {
  Tensor out = Tensor::empty(c.outputs[0]);
  Tensor a = view::expand(c.inputs[0], out.shape()), b = view::expand(c.inputs[1], out.shape());
  activate(out.device());
  launch_binary(kOp, code_of(out, c.op.name), out.raw_data(), a.raw_data(), b.raw_data(), strides_of(out, &a, &b),
                out.numel(), stream_for(out.device()));
  check(cudaGetLastError(), c.op.name);
  return {out};
}

template <Unary kOp>
std::vector<Tensor> unary_forward(const OpCall& c) {
  Tensor out = Tensor::empty(c.outputs[0]);
  const Tensor& x = c.inputs[0];
  Unary op = kOp;
  if (kOp == Unary::gelu && c.attrs.b("tanh")) op = Unary::gelu_tanh;
  double alpha = kOp == Unary::scale ? c.attrs.f("alpha") : 1.0;
  double beta = kOp == Unary::scale ? c.attrs.f_or("beta", 0.0) : 0.0;
  activate(out.device());
  launch_unary(op, code_of(out, c.op.name), out.raw_data(), x.raw_data(), strides_of(out, &x), out.numel(), alpha, beta,
               stream_for(out.device()));
  check(cudaGetLastError(), c.op.name);
  return {out};
}

// out[..., M, N] = op(A)[..., M, K] @ op(B)[..., K, N], batch dims broadcast: both operands
// expanded to the output's batch and made contiguous, then one strided-batched GEMM.
std::vector<Tensor> matmul_forward(const OpCall& c) {
  Tensor out = Tensor::empty(c.outputs[0]);
  bool ta = c.attrs.b("trans_a"), tb = c.attrs.b("trans_b");
  const Tensor& a = c.inputs[0];
  const Tensor& b = c.inputs[1];
  Shape batch(out.shape().begin(), out.shape().end() - 2);
  auto batched = [&](const Tensor& t) {
    Shape s = batch;
    s.push_back(t.size(-2));
    s.push_back(t.size(-1));
    return view::contiguous(view::expand(t, s));
  };
  Tensor ac = batched(a), bc = batched(b);
  Gemm g;
  g.trans_a = ta;
  g.trans_b = tb;
  g.M = out.size(-2);
  g.N = out.size(-1);
  g.K = ta ? a.size(-2) : a.size(-1);
  g.batch = shape_numel(batch);
  g.a = ac.raw_data();
  g.b = bc.raw_data();
  g.c = out.raw_data();
  if (g.K == 0) {
    view::fill(out, 0.0);
    return {out};
  }
  gemm(out.device(), out.dtype(), g);
  return {out};
}

// y[R, O] = x[R, I] @ W (+ bias[O]); W is w[I, O...] (weight_in_out) or w[O, I].
std::vector<Tensor> linear_forward(const OpCall& c) {
  Tensor out = Tensor::empty(c.outputs[0]);
  bool in_out = c.attrs.b("weight_in_out");
  Tensor x = view::contiguous(c.inputs[0]), w = view::contiguous(c.inputs[1]);
  Tensor bias = c.inputs.size() == 3 ? view::contiguous(c.inputs[2]) : Tensor();
  Gemm g;
  g.K = x.size(-1);
  g.M = g.K == 0 ? 0 : x.numel() / g.K;
  g.N = in_out ? w.numel() / std::max<int64_t>(w.size(0), 1) : w.size(0);
  g.trans_b = !in_out;
  g.a = x.raw_data();
  g.b = w.raw_data();
  g.c = out.raw_data();
  g.bias = bias.defined() ? bias.raw_data() : nullptr;
  if (g.K == 0 || g.M == 0) {  // an empty contraction: the bias alone
    view::fill(out, 0.0);
    if (bias.defined()) view::copy(out, view::reshape(bias, {bias.numel()}));
    return {out};
  }
  gemm(out.device(), out.dtype(), g);
  return {out};
}

// sum and mean over `dims`: the reduced dims moved last and made contiguous (the backend's
// strided copy), then one row sum per output element.
template <bool kMean>
std::vector<Tensor> reduce_forward(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  const std::vector<int64_t> dims = normalize_dims(c.attrs.ints("dims"), x.dim(), c.op.name);
  std::vector<int64_t> order;
  int64_t K = 1;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (!std::binary_search(dims.begin(), dims.end(), d)) order.push_back(d);
  for (int64_t d : dims) {
    order.push_back(d);
    K *= x.size(d);
  }
  const Tensor xc = view::contiguous(view::permute(x, order));
  Tensor out = Tensor::empty(c.outputs[0]);
  const int64_t M = out.numel();
  int64_t n = K;
  if (kMean && c.attrs.has("count")) n = c.attrs.i("count");  // a sharded mean: the global count
  const double scale = kMean ? (n == 0 ? std::nan("") : 1.0 / static_cast<double>(n)) : 1.0;
  activate(out.device());
  launch_row_sum(code_of(out, c.op.name), xc.raw_data(), out.raw_data(), M, K, scale, stream_for(out.device()));
  check(cudaGetLastError(), c.op.name);
  return {out};
}

// The in-place updates and the AdamW step (ops/device_fns.h).
void add_inplace(const Tensor& dst, const Tensor& src, double alpha) {
  activate(dst.device());
  launch_axpy(code_of(dst, "add_"), dst.raw_data(), src.raw_data(), strides_of(dst, &src), dst.numel(), alpha,
              stream_for(dst.device()));
  check(cudaGetLastError(), "add_");
}

void scale_inplace(const Tensor& dst, double alpha) {
  activate(dst.device());
  launch_unary(Unary::scale, code_of(dst, "scale_"), dst.raw_data(), dst.raw_data(), strides_of(dst, &dst),
               dst.numel(), alpha, 0.0, stream_for(dst.device()));
  check(cudaGetLastError(), "scale_");
}

void adamw_step(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const AdamWScalars& k) {
  activate(p.device());
  launch_adamw(static_cast<float*>(p.raw_data()), static_cast<const float*>(g.raw_data()),
               static_cast<float*>(m.raw_data()), static_cast<float*>(v.raw_data()), p.numel(), k,
               stream_for(p.device()));
  check(cudaGetLastError(), "adamw_update");
}

}  // namespace

void install() {
  static bool done = [] {
    install_cuda_backend();
    // `composite`: the OpDef's backward only calls ops, so it runs on the GPU as it is.
    auto reg = [](const OpDef& op, ForwardFn f, bool composite = false) {
      register_kernel(op, DeviceType::cuda, DeviceKernel{f, nullptr, composite});
    };
    reg(op_add, binary_forward<Binary::add>, true);
    reg(op_sub, binary_forward<Binary::sub>, true);
    reg(op_mul, binary_forward<Binary::mul>, true);
    reg(op_div, binary_forward<Binary::div>, true);
    reg(op_neg, unary_forward<Unary::neg>);
    reg(op_exp, unary_forward<Unary::exp>);
    reg(op_log, unary_forward<Unary::log>);
    reg(op_sqrt, unary_forward<Unary::sqrt>);
    reg(op_rsqrt, unary_forward<Unary::rsqrt>);
    reg(op_tanh, unary_forward<Unary::tanh>);
    reg(op_silu, unary_forward<Unary::silu>);
    reg(op_relu, unary_forward<Unary::relu>);
    reg(op_gelu, unary_forward<Unary::gelu>);
    reg(op_scale, unary_forward<Unary::scale>, true);
    reg(op_matmul, matmul_forward, true);
    reg(op_sum, reduce_forward<false>, true);
    reg(op_mean, reduce_forward<true>, true);
    reg(op_linear, linear_forward);
    register_device_fn("add_", DeviceType::cuda, reinterpret_cast<void*>(&add_inplace));
    register_device_fn("scale_", DeviceType::cuda, reinterpret_cast<void*>(&scale_inplace));
    register_device_fn("adamw_update", DeviceType::cuda, reinterpret_cast<void*>(&adamw_step));
    // Views and copies only: their OpDef's forward is device-neutral.
    for (const OpDef* op : {&op_cast, &op_reshape, &op_permute, &op_expand, &op_contiguous, &op_cat, &op_split,
                            &op_slice})
      reg(*op, op->forward, true);
    return true;
  }();
  (void)done;
}

}  // namespace tessel::cuda
