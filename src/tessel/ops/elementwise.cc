// Elementwise ops. Binary ops broadcast; their kernels specialise the inner run for the
// common contiguous and scalar-broadcast strides. Unary ops are one functor each (value and
// derivative side by side); f32 uses the vectorisable exp/tanh of fast_math.h.
//
// Shapes: out[...] = f(a[...], b[...]) with a, b broadcast to out.
#include <cmath>
#include <functional>
#include <type_traits>

#include "tessel/core/strided.h"
#include "tessel/ops/dispatch.h"
#include "tessel/ops/elementwise.h"
#include "tessel/ops/fast_math.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/ops/op_list.h"
#include "tessel/sharding/spmd_rules.h"

namespace tessel {

using kernels::check_floating;
using kernels::check_same_dtype;
using kernels::map1;
using kernels::map2;
using kernels::sum_to;

namespace {

// ---------------------------------------------------------------- binary (broadcasting)

std::vector<TensorMeta> binary_infer(const MetaCall& c) {
  check_floating(c, 0);
  check_floating(c, 1);
  check_same_dtype(c, 0, 1);
  return {TensorMeta{broadcast_shapes(c.inputs[0].shape, c.inputs[1].shape, c.op.name), c.inputs[0].dtype, {}}};
}

Cost binary_cost(const MetaCall& c, std::span<const TensorMeta> out) { return kernels::elementwise_cost(c, out, 1); }

template <typename T, typename F>
void binary_kernel(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  T* __restrict y = out.data<T>();
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  if (a.shape() == out.shape() && b.shape() == out.shape() && a.is_contiguous() && b.is_contiguous()) {
    parallel_for(0, out.numel(), kernels::kElementGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) y[i] = f(pa[i], pb[i]);
    });
    return;
  }
  Tensor ae = view::expand(a, out.shape()), be = view::expand(b, out.shape());
  StridedLoop<3> loop(out.shape(), {&out.strides(), &ae.strides(), &be.strides()});
  int64_t grain = std::max<int64_t>(1, kernels::kElementGrain / std::max<int64_t>(1, loop.inner_size()));
  parallel_for(0, loop.outer_count(), grain, [&](int64_t lo, int64_t hi) {
    loop.run(lo, hi, [&](const auto& off, int64_t n, const auto& st) {
      T* __restrict yo = y + off[0];
      const T* ao = pa + off[1];
      const T* bo = pb + off[2];
      if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
        for (int64_t i = 0; i < n; ++i) yo[i] = f(ao[i], bo[i]);
      } else if (st[0] == 1 && st[1] == 1 && st[2] == 0) {
        const T bv = *bo;
        for (int64_t i = 0; i < n; ++i) yo[i] = f(ao[i], bv);
      } else if (st[0] == 1 && st[1] == 0 && st[2] == 1) {
        const T av = *ao;
        for (int64_t i = 0; i < n; ++i) yo[i] = f(av, bo[i]);
      } else {
        for (int64_t i = 0; i < n; ++i) yo[i * st[0]] = f(ao[i * st[1]], bo[i * st[2]]);
      }
    });
  });
}

template <typename F>
std::vector<Tensor> binary_forward(const OpCall& c, F f) {
  Tensor out = Tensor::empty(c.outputs[0]);
  TESSEL_DISPATCH_FLOAT(out.dtype(), c.op.name, [&]<typename T>() { binary_kernel<T>(c.inputs[0], c.inputs[1], out, f.template operator()<T>()); });
  return {out};
}

struct AddF { template <typename T> auto operator()() const { return [](T x, T y) { return x + y; }; } };
struct SubF { template <typename T> auto operator()() const { return [](T x, T y) { return x - y; }; } };
struct MulF { template <typename T> auto operator()() const { return [](T x, T y) { return x * y; }; } };
struct DivF { template <typename T> auto operator()() const { return [](T x, T y) { return x / y; }; } };

std::vector<Tensor> add_forward(const OpCall& c) { return binary_forward(c, AddF{}); }
std::vector<Tensor> sub_forward(const OpCall& c) { return binary_forward(c, SubF{}); }
std::vector<Tensor> mul_forward(const OpCall& c) { return binary_forward(c, MulF{}); }
std::vector<Tensor> div_forward(const OpCall& c) { return binary_forward(c, DivF{}); }

// d(a+b) = (g, g); d(a-b) = (g, -g), each summed back to its input's shape.
std::vector<Tensor> add_backward(const GradCall& g) {
  const Tensor& go = g.grad_outputs[0];
  return {g.needs_grad[0] ? sum_to(go, g.input_metas[0].shape) : Tensor(),
          g.needs_grad[1] ? sum_to(go, g.input_metas[1].shape) : Tensor()};
}
std::vector<Tensor> sub_backward(const GradCall& g) {
  const Tensor& go = g.grad_outputs[0];
  return {g.needs_grad[0] ? sum_to(go, g.input_metas[0].shape) : Tensor(),
          g.needs_grad[1] ? neg(sum_to(go, g.input_metas[1].shape)) : Tensor()};
}
// d(a*b) = (g*b, g*a).
std::vector<Tensor> mul_backward(const GradCall& g) {
  const Tensor& go = g.grad_outputs[0];
  return {g.needs_grad[0] ? sum_to(mul(go, g.inputs[1]), g.input_metas[0].shape) : Tensor(),
          g.needs_grad[1] ? sum_to(mul(go, g.inputs[0]), g.input_metas[1].shape) : Tensor()};
}
// d(a/b) = (g/b, -g*a/b²).
std::vector<Tensor> div_backward(const GradCall& g) {
  const Tensor& go = g.grad_outputs[0];
  const Tensor& a = g.inputs[0];
  const Tensor& b = g.inputs[1];
  return {g.needs_grad[0] ? sum_to(div(go, b), g.input_metas[0].shape) : Tensor(),
          g.needs_grad[1] ? sum_to(neg(div(mul(go, a), mul(b, b))), g.input_metas[1].shape) : Tensor()};
}

// ---------------------------------------------------------------- comparisons
// out[...] = a[...] OP b[...] (bool), broadcasting; any dtype, both alike. No gradient: the
// result is piecewise constant. bf16 compares as its float value.

std::vector<TensorMeta> compare_infer(const MetaCall& c) {
  check_same_dtype(c, 0, 1);
  return {TensorMeta{broadcast_shapes(c.inputs[0].shape, c.inputs[1].shape, c.op.name), DType::b8, {}}};
}

template <typename T>
auto comparable(T x) {
  if constexpr (std::is_same_v<T, BFloat16>) return static_cast<float>(x);
  else return x;
}

template <typename F>
std::vector<Tensor> compare_forward(const OpCall& c) {
  Tensor out = Tensor::empty(c.outputs[0]);
  const Tensor a = view::contiguous(view::expand(c.inputs[0], out.shape()));
  const Tensor b = view::contiguous(view::expand(c.inputs[1], out.shape()));
  bool* y = out.data<bool>();
  TESSEL_DISPATCH_ALL(a.dtype(), c.op.name, [&]<typename T>() {
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    parallel_for(0, out.numel(), kernels::kElementGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) y[i] = F{}(comparable(pa[i]), comparable(pb[i]));
    });
  });
  return {out};
}

constexpr OpDef compare_def(std::string_view name, std::vector<Tensor> (*forward)(const OpCall&), SpmdRule spmd) {
  return OpDef{.name = name, .num_inputs = 2, .infer = compare_infer, .forward = forward, .cost = binary_cost,
               .spmd = spmd, .bf16_via_f32 = false};
}

// ---------------------------------------------------------------- unary (one functor each)

std::vector<TensorMeta> unary_infer(const MetaCall& c) {
  check_floating(c, 0);
  return {c.inputs[0]};
}

// Each functor: f(x) is the value, df(g, s) the input gradient from the output gradient g
// and the saved tensor s (the output when kSaveOutput, else the input).
struct NegF {
  static constexpr bool kSaveOutput = false;
  template <typename T> static T f(T x) { return -x; }
  template <typename T> static T df(T g, T) { return -g; }
};
struct ExpF {
  static constexpr bool kSaveOutput = true;
  template <typename T> static T f(T x) { return fast::exp_t<T>(x); }
  template <typename T> static T df(T g, T y) { return g * y; }
};
struct LogF {
  static constexpr bool kSaveOutput = false;
  template <typename T> static T f(T x) { return std::log(x); }
  template <typename T> static T df(T g, T x) { return g / x; }
};
struct SqrtF {
  static constexpr bool kSaveOutput = true;
  template <typename T> static T f(T x) { return std::sqrt(x); }
  template <typename T> static T df(T g, T y) { return g * T(0.5) / y; }
};
struct RsqrtF {
  static constexpr bool kSaveOutput = true;
  template <typename T> static T f(T x) { return T(1) / std::sqrt(x); }
  template <typename T> static T df(T g, T y) { return g * T(-0.5) * y * y * y; }
};
struct TanhF {
  static constexpr bool kSaveOutput = true;
  template <typename T> static T f(T x) { return fast::tanh_t<T>(x); }
  template <typename T> static T df(T g, T y) { return g * (T(1) - y * y); }
};
struct SiluF {
  static constexpr bool kSaveOutput = false;
  template <typename T> static T f(T x) { return x * fast::sigmoid_t<T>(x); }
  template <typename T> static T df(T g, T x) {
    T s = fast::sigmoid_t<T>(x);
    return g * s * (T(1) + x * (T(1) - s));
  }
};
struct ReluF {
  static constexpr bool kSaveOutput = true;
  template <typename T> static T f(T x) { return x > T(0) ? x : T(0); }
  template <typename T> static T df(T g, T y) { return y > T(0) ? g : T(0); }
};

template <typename F>
std::vector<Tensor> unary_forward(const OpCall& c) {
  return {TESSEL_DISPATCH_FLOAT(c.inputs[0].dtype(), c.op.name,
                                [&]<typename T>() { return map1<T>(c.inputs[0], [](T x) { return F::template f<T>(x); }); })};
}

template <typename F>
std::vector<Tensor> unary_backward(const GradCall& g) {
  const Tensor& saved = F::kSaveOutput ? g.outputs[0] : g.inputs[0];
  const Tensor& go = g.grad_outputs[0];
  if (!saved.defined()) {  // neg saves nothing: the derivative ignores its second argument
    return {TESSEL_DISPATCH_FLOAT(go.dtype(), g.op.name,
                                  [&]<typename T>() { return map1<T>(go, [](T v) { return F::template df<T>(v, T(0)); }); })};
  }
  return {TESSEL_DISPATCH_FLOAT(go.dtype(), g.op.name, [&]<typename T>() {
    return map2<T>(go, saved, [](T v, T s) { return F::template df<T>(v, s); });
  })};
}

Cost unary_cost(const MetaCall& c, std::span<const TensorMeta> out) { return kernels::elementwise_cost(c, out, 1); }

SpmdDecision single_spmd(const SpmdCall& c);
SpmdDecision nonlinear_spmd(const SpmdCall& c);

template <typename F>
constexpr OpDef unary_def(std::string_view name, bool save, SpmdRule spmd) {
  return OpDef{.name = name,
               .num_inputs = 1,
               .infer = unary_infer,
               .forward = unary_forward<F>,
               .backward = unary_backward<F>,
               .cost = unary_cost,
               .spmd = spmd,
               .save = save ? (F::kSaveOutput ? SaveSpec{0, 1} : SaveSpec{1, 0}) : SaveSpec{}};
}

// ---------------------------------------------------------------- scale: alpha * x + beta

std::vector<Tensor> scale_forward(const OpCall& c) {
  double alpha = c.attrs.f("alpha"), beta = c.attrs.f_or("beta", 0.0);
  return {TESSEL_DISPATCH_FLOAT(c.inputs[0].dtype(), "scale", [&]<typename T>() {
    T a = static_cast<T>(alpha), b = static_cast<T>(beta);
    return map1<T>(c.inputs[0], [=](T x) { return a * x + b; });
  })};
}
std::vector<Tensor> scale_backward(const GradCall& g) { return {scale(g.grad_outputs[0], g.attrs.f("alpha"))}; }

// ---------------------------------------------------------------- gelu

// Exact: y = x·Φ(x). Tanh approximation: y = ½x(1 + tanh(√(2/π)(x + 0.044715x³))).
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;

// Exact: x·Φ(x). Tanh approximation: ½x(1 + tanh(u)) = x·σ(2u), u = √(2/π)(x + 0.044715x³) —
// one exp and one division, no tanh. The form is a template parameter so the element loops
// inline and vectorise.
template <typename T, bool kApprox>
T gelu_value(T x) {
  if constexpr (kApprox) {
    T u = T(kSqrt2OverPi) * (x + T(0.044715) * x * x * x);
    return x / (T(1) + fast::exp_t<T>(T(-2) * u));
  } else {
    return T(0.5) * x * (T(1) + std::erf(x * T(kInvSqrt2)));
  }
}
template <typename T, bool kApprox>
T gelu_grad(T x) {
  if constexpr (kApprox) {  // d/dx x·σ(2u) = σ + 2x·σ(1-σ)·u'
    T u = T(kSqrt2OverPi) * (x + T(0.044715) * x * x * x);
    T s = T(1) / (T(1) + fast::exp_t<T>(T(-2) * u));
    T du = T(kSqrt2OverPi) * (T(1) + T(3 * 0.044715) * x * x);
    return s + T(2) * x * s * (T(1) - s) * du;
  } else {
    return T(0.5) * (T(1) + std::erf(x * T(kInvSqrt2))) + x * std::exp(T(-0.5) * x * x) * T(kInvSqrt2Pi);
  }
}

std::vector<Tensor> gelu_forward(const OpCall& c) {
  bool approx = c.attrs.b("tanh");
  return {TESSEL_DISPATCH_FLOAT(c.inputs[0].dtype(), "gelu", [&]<typename T>() {
    if (approx) return map1<T>(c.inputs[0], [](T x) { return gelu_value<T, true>(x); });
    return map1<T>(c.inputs[0], [](T x) { return gelu_value<T, false>(x); });
  })};
}
std::vector<Tensor> gelu_backward(const GradCall& g) {
  bool approx = g.attrs.b("tanh");
  return {TESSEL_DISPATCH_FLOAT(g.grad_outputs[0].dtype(), "gelu", [&]<typename T>() {
    if (approx) return map2<T>(g.grad_outputs[0], g.inputs[0], [](T v, T x) { return v * gelu_grad<T, true>(x); });
    return map2<T>(g.grad_outputs[0], g.inputs[0], [](T v, T x) { return v * gelu_grad<T, false>(x); });
  })};
}
Cost gelu_cost(const MetaCall& c, std::span<const TensorMeta> out) { return kernels::elementwise_cost(c, out, 8); }

// ---------------------------------------------------------------- cast

std::vector<TensorMeta> cast_infer(const MetaCall& c) { return {TensorMeta{c.inputs[0].shape, c.attrs.dtype("dtype"), {}}}; }
std::vector<Tensor> cast_forward(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  DType to = c.attrs.dtype("dtype");
  if (x.dtype() == to) return {x.detach()};  // a fresh handle: the output never aliases the input's autograd slot
  return {view::to_dtype(x, to)};
}
std::vector<Tensor> cast_backward(const GradCall& g) {
  DType from = g.input_metas[0].dtype;
  if (!is_floating(from)) return {Tensor()};
  return {g.grad_outputs[0].dtype() == from ? g.grad_outputs[0] : cast(g.grad_outputs[0], from)};
}
Cost cast_cost(const MetaCall& c, std::span<const TensorMeta> out) { return kernels::elementwise_cost(c, out, 0); }

// ---------------------------------------------------------------- SPMD rules
// Elementwise ops shard any dim of the broadcast output; linear ones keep Partial inputs
// Partial: add/sub all together, mul one at a time, div in the numerator, neg/cast/scale
// (without offset) their input.

using spmd::Linearity;
SpmdDecision joint_spmd(const SpmdCall& c) { return spmd::elementwise_rule(c, Linearity::joint); }
SpmdDecision single_spmd(const SpmdCall& c) { return spmd::elementwise_rule(c, Linearity::single); }
SpmdDecision first_spmd(const SpmdCall& c) { return spmd::elementwise_rule(c, Linearity::first); }
SpmdDecision nonlinear_spmd(const SpmdCall& c) { return spmd::elementwise_rule(c, Linearity::none); }
SpmdDecision scale_spmd(const SpmdCall& c) {
  return spmd::elementwise_rule(c, c.attrs.f_or("beta", 0.0) == 0.0 ? Linearity::single : Linearity::none);
}

}  // namespace

// Comparisons: elementwise labels, nonlinear (a Partial input is reduced first); the bool
// output keeps the inputs' shards.
const OpDef op_eq = compare_def("eq", compare_forward<std::equal_to<>>, nonlinear_spmd);
const OpDef op_ne = compare_def("ne", compare_forward<std::not_equal_to<>>, nonlinear_spmd);
const OpDef op_lt = compare_def("lt", compare_forward<std::less<>>, nonlinear_spmd);
const OpDef op_le = compare_def("le", compare_forward<std::less_equal<>>, nonlinear_spmd);
const OpDef op_gt = compare_def("gt", compare_forward<std::greater<>>, nonlinear_spmd);
const OpDef op_ge = compare_def("ge", compare_forward<std::greater_equal<>>, nonlinear_spmd);

const OpDef op_add{.name = "add", .num_inputs = 2, .infer = binary_infer, .forward = add_forward,
                   .backward = add_backward, .cost = binary_cost, .spmd = joint_spmd};
const OpDef op_sub{.name = "sub", .num_inputs = 2, .infer = binary_infer, .forward = sub_forward,
                   .backward = sub_backward, .cost = binary_cost, .spmd = joint_spmd};
const OpDef op_mul{.name = "mul", .num_inputs = 2, .infer = binary_infer, .forward = mul_forward,
                   .backward = mul_backward, .cost = binary_cost, .spmd = single_spmd, .save = {0b11, 0}};
const OpDef op_div{.name = "div", .num_inputs = 2, .infer = binary_infer, .forward = div_forward,
                   .backward = div_backward, .cost = binary_cost, .spmd = first_spmd, .save = {0b11, 0}};
const OpDef op_scale{.name = "scale", .num_inputs = 1, .infer = unary_infer, .forward = scale_forward,
                     .backward = scale_backward, .cost = unary_cost, .spmd = scale_spmd,
                     .attrs = "alpha: float, beta: float = 0.0"};
const OpDef op_neg = unary_def<NegF>("neg", false, single_spmd);
const OpDef op_exp = unary_def<ExpF>("exp", true, nonlinear_spmd);
const OpDef op_log = unary_def<LogF>("log", true, nonlinear_spmd);
const OpDef op_sqrt = unary_def<SqrtF>("sqrt", true, nonlinear_spmd);
const OpDef op_rsqrt = unary_def<RsqrtF>("rsqrt", true, nonlinear_spmd);
const OpDef op_tanh = unary_def<TanhF>("tanh", true, nonlinear_spmd);
const OpDef op_silu = unary_def<SiluF>("silu", true, nonlinear_spmd);
const OpDef op_relu = unary_def<ReluF>("relu", true, nonlinear_spmd);
const OpDef op_gelu{.name = "gelu", .num_inputs = 1, .infer = unary_infer, .forward = gelu_forward,
                    .backward = gelu_backward, .cost = gelu_cost, .spmd = nonlinear_spmd, .save = {1, 0},
                    .attrs = "tanh: bool = false"};
const OpDef op_cast{.name = "cast", .num_inputs = 1, .infer = cast_infer, .forward = cast_forward,
                    .backward = cast_backward, .cost = cast_cost, .spmd = single_spmd, .bf16_via_f32 = false,
                    .attrs = "dtype: dtype"};

Tensor add(const Tensor& a, const Tensor& b) { return call_op1(op_add, {a, b}); }
Tensor sub(const Tensor& a, const Tensor& b) { return call_op1(op_sub, {a, b}); }
Tensor mul(const Tensor& a, const Tensor& b) { return call_op1(op_mul, {a, b}); }
Tensor div(const Tensor& a, const Tensor& b) { return call_op1(op_div, {a, b}); }
Tensor scale(const Tensor& x, double alpha, double beta) {
  return call_op1(op_scale, {x}, Attrs{{"alpha", alpha}, {"beta", beta}});
}
Tensor neg(const Tensor& x) { return call_op1(op_neg, {x}); }
Tensor exp(const Tensor& x) { return call_op1(op_exp, {x}); }
Tensor log(const Tensor& x) { return call_op1(op_log, {x}); }
Tensor sqrt(const Tensor& x) { return call_op1(op_sqrt, {x}); }
Tensor rsqrt(const Tensor& x) { return call_op1(op_rsqrt, {x}); }
Tensor tanh(const Tensor& x) { return call_op1(op_tanh, {x}); }
Tensor gelu(const Tensor& x, bool tanh_approximation) { return call_op1(op_gelu, {x}, Attrs{{"tanh", tanh_approximation}}); }
Tensor silu(const Tensor& x) { return call_op1(op_silu, {x}); }
Tensor relu(const Tensor& x) { return call_op1(op_relu, {x}); }
Tensor cast(const Tensor& x, DType dtype) { return call_op1(op_cast, {x}, Attrs{{"dtype", dtype}}); }
Tensor eq(const Tensor& a, const Tensor& b) { return call_op1(op_eq, {a, b}); }
Tensor ne(const Tensor& a, const Tensor& b) { return call_op1(op_ne, {a, b}); }
Tensor lt(const Tensor& a, const Tensor& b) { return call_op1(op_lt, {a, b}); }
Tensor le(const Tensor& a, const Tensor& b) { return call_op1(op_le, {a, b}); }
Tensor gt(const Tensor& a, const Tensor& b) { return call_op1(op_gt, {a, b}); }
Tensor ge(const Tensor& a, const Tensor& b) { return call_op1(op_ge, {a, b}); }

}  // namespace tessel
