// Cases for elementwise.cc: binary ops with broadcasting and edge shapes, unary ops, cast.
#include <cmath>

#include "op_cases.h"

namespace tessel::testing {

namespace {

// out = f(a, b) with numpy broadcasting, by loops over the output index.
Tensor ref_binary(const Tensor& a, const Tensor& b, double (*f)(double, double)) {
  Nd x(a), y(b);
  Shape out = broadcast_shapes(a.shape(), b.shape(), "ref");
  Nd r(out);
  auto pick = [&](const Nd& n, const std::vector<int64_t>& idx) {
    std::vector<int64_t> j(n.shape.size());
    size_t lead = idx.size() - n.shape.size();
    for (size_t d = 0; d < n.shape.size(); ++d) j[d] = n.shape[d] == 1 ? 0 : idx[lead + d];
    return n(j);
  };
  Nd::for_each(out, [&](const std::vector<int64_t>& idx) { r(idx) = f(pick(x, idx), pick(y, idx)); });
  return r.tensor();
}

Tensor ref_unary(const Tensor& a, double (*f)(double)) {
  Nd x(a);
  for (double& v : x.v) v = f(v);
  return x.tensor();
}

struct BinaryShape {
  const char* tag;
  Shape a, b;
};
const BinaryShape kBinaryShapes[] = {
    {"same", {3, 4}, {3, 4}},          {"broadcast", {2, 1, 4}, {3, 1}}, {"scalar", {3, 4}, {}},
    {"row", {5}, {2, 5}},              {"empty", {0, 3}, {3}},           {"size1", {1, 1}, {1}},
};

struct BinaryOp {
  const char* name;
  Tensor (*fn)(const Tensor&, const Tensor&);
  double (*ref)(double, double);
  double b_lo;  // div keeps b away from zero
};
const BinaryOp kBinaryOps[] = {
    {"add", add, [](double x, double y) { return x + y; }, -1.0},
    {"sub", sub, [](double x, double y) { return x - y; }, -1.0},
    {"mul", mul, [](double x, double y) { return x * y; }, -1.0},
    {"div", div, [](double x, double y) { return x / y; }, 0.5},
};

struct UnaryOp {
  const char* name;
  const char* op;
  Tensor (*fn)(const Tensor&);
  double (*ref)(double);
  double lo, hi;
};
double gelu_exact(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
const UnaryOp kUnaryOps[] = {
    {"neg", "neg", neg, [](double x) { return -x; }, -2, 2},
    {"exp", "exp", exp, [](double x) { return std::exp(x); }, -3, 3},
    {"log", "log", log, [](double x) { return std::log(x); }, 0.2, 3},
    {"sqrt", "sqrt", sqrt, [](double x) { return std::sqrt(x); }, 0.2, 3},
    {"rsqrt", "rsqrt", rsqrt, [](double x) { return 1 / std::sqrt(x); }, 0.2, 3},
    {"tanh", "tanh", tanh, [](double x) { return std::tanh(x); }, -3, 3},
    {"gelu/exact", "gelu", [](const Tensor& x) { return gelu(x, false); }, gelu_exact, -4, 4},
    {"gelu/tanh", "gelu", [](const Tensor& x) { return gelu(x, true); }, gelu_tanh, -4, 4},
    {"silu", "silu", silu, [](double x) { return x / (1 + std::exp(-x)); }, -4, 4},
    {"relu", "relu", relu, [](double x) { return x > 0 ? x : 0.0; }, -2, 2},
    {"scale", "scale", [](const Tensor& x) { return scale(x, 2.5, -0.5); }, [](double x) { return 2.5 * x - 0.5; }, -2, 2},
};

struct CompareOp {
  const char* name;
  Tensor (*fn)(const Tensor&, const Tensor&);
  double (*ref)(double, double);
};
const CompareOp kCompareOps[] = {
    {"eq", eq, [](double x, double y) { return x == y ? 1.0 : 0.0; }},
    {"ne", ne, [](double x, double y) { return x != y ? 1.0 : 0.0; }},
    {"lt", lt, [](double x, double y) { return x < y ? 1.0 : 0.0; }},
    {"le", le, [](double x, double y) { return x <= y ? 1.0 : 0.0; }},
    {"gt", gt, [](double x, double y) { return x > y ? 1.0 : 0.0; }},
    {"ge", ge, [](double x, double y) { return x >= y ? 1.0 : 0.0; }},
};

// Values on a grid of halves in [-1, 1], so that equal pairs are common (and exact in bf16).
Tensor grid_tensor(const Shape& shape, DType d, uint64_t seed) {
  Nd x(rand_tensor(shape, DType::f64, seed));
  for (double& v : x.v) v = std::round(v * 2) / 2;
  return x.tensor(d);
}

}  // namespace

std::vector<OpCase> elementwise_cases() {
  std::vector<OpCase> out;
  for (const BinaryOp& op : kBinaryOps)
    for (const BinaryShape& s : kBinaryShapes) {
      OpCase c;
      c.name = fmt::format("{}/{}", op.name, s.tag);
      c.op = op.name;
      Shape sa = s.a, sb = s.b;
      double lo = op.b_lo;
      c.make_inputs = [sa, sb, lo](DType d) {
        return Tensors{rand_tensor(sa, d, 1), rand_tensor(sb, d, 2, lo, lo + 2.0)};
      };
      auto fn = op.fn;
      auto ref = op.ref;
      c.run = [fn](const Tensors& in) { return Tensors{fn(in[0], in[1])}; };
      c.reference = [ref](const Tensors& in) { return Tensors{ref_binary(in[0], in[1], ref)}; };
      out.push_back(std::move(c));
    }
  for (const UnaryOp& op : kUnaryOps)
    for (Shape shape : {Shape{3, 5}, Shape{0, 2}, Shape{}}) {
      OpCase c;
      c.name = fmt::format("{}/{}", op.name, shape.empty() ? "scalar" : shape_str(shape));
      c.op = op.op;
      double lo = op.lo, hi = op.hi;
      c.make_inputs = [shape, lo, hi](DType d) { return Tensors{rand_tensor(shape, d, 3, lo, hi)}; };
      auto fn = op.fn;
      auto ref = op.ref;
      c.run = [fn](const Tensors& in) { return Tensors{fn(in[0])}; };
      c.reference = [ref](const Tensors& in) { return Tensors{ref_unary(in[0], ref)}; };
      out.push_back(std::move(c));
    }
  for (const CompareOp& op : kCompareOps) {
    // where on the comparison: the selection's gradient reaches the selected input only.
    OpCase w;
    w.name = fmt::format("{}/where", op.name);
    w.op = op.name;
    w.make_inputs = [](DType d) { return Tensors{grid_tensor({4, 6}, d, 11), grid_tensor({4, 6}, d, 12)}; };
    auto fn = op.fn;
    auto ref = op.ref;
    w.run = [fn](const Tensors& in) { return Tensors{where(fn(in[0], in[1]), in[0], in[1])}; };
    w.reference = [ref](const Tensors& in) {
      Nd a(in[0]), b(in[1]);
      for (size_t i = 0; i < a.v.size(); ++i) a.v[i] = ref(a.v[i], b.v[i]) != 0 ? a.v[i] : b.v[i];
      return Tensors{a.tensor()};
    };
    w.grad = false;  // piecewise: finite differences straddle the ties; the rule validator checks gradients
    out.push_back(std::move(w));
    for (const BinaryShape& s : kBinaryShapes) {
      OpCase c;
      c.name = fmt::format("{}/{}", op.name, s.tag);
      c.op = op.name;
      Shape sa = s.a, sb = s.b;
      c.make_inputs = [sa, sb](DType d) { return Tensors{grid_tensor(sa, d, 13), grid_tensor(sb, d, 14)}; };
      c.run = [fn](const Tensors& in) { return Tensors{fn(in[0], in[1])}; };
      c.reference = [ref](const Tensors& in) { return Tensors{Nd(ref_binary(in[0], in[1], ref)).tensor(DType::b8)}; };
      c.grad = false;
      c.keeps_dtype = false;
      out.push_back(std::move(c));
    }
  }
  // cast up to f64 is the identity on values and passes gradients through.
  out.push_back(OpCase{.name = "cast/to_f64",
                       .op = "cast",
                       .make_inputs = [](DType d) { return Tensors{rand_tensor({4, 3}, d, 4)}; },
                       .run = TESSEL_RUN1(cast(in[0], DType::f64)),
                       .reference = [](const Tensors& in) { return Tensors{in[0]}; },
                       .keeps_dtype = false});
  // cast down rounds to the nearest f32 (checked by value; rounding has no useful gradient).
  out.push_back(OpCase{.name = "cast/to_f32",
                       .op = "cast",
                       .make_inputs = [](DType d) { return Tensors{rand_tensor({4, 3}, d, 5)}; },
                       .run = TESSEL_RUN1(cast(in[0], DType::f32)),
                       .reference =
                           [](const Tensors& in) {
                             Nd x(in[0]);
                             for (double& v : x.v) v = static_cast<double>(static_cast<float>(v));
                             return Tensors{x.tensor(DType::f32)};
                           },
                       .grad = false,
                       .keeps_dtype = false});
  return out;
}

std::vector<ErrorCase> elementwise_errors() {
  return {
      {"add_shapes", [] { add(Tensor::zeros({2, 3}), Tensor::zeros({4})); }, {"add", "[2, 3]", "[4]"}},
      {"mul_dtypes", [] { mul(Tensor::zeros({2}, DType::f32), Tensor::zeros({2}, DType::f64)); }, {"mul", "f32", "f64"}},
      {"add_bf16_f32", [] { add(Tensor::zeros({2}, DType::bf16), Tensor::zeros({2}, DType::f32)); }, {"add", "bf16", "f32"}},
      {"exp_int", [] { exp(Tensor::zeros({2}, DType::i64)); }, {"exp", "i64"}},
      {"cast_bool_grad", [] { Tensor::zeros({2}, DType::b8).set_requires_grad(true); }, {"bool", "floating"}},
  };
}

}  // namespace tessel::testing
