// Cases for select.cc: where and masked_fill with broadcasting and edge shapes (a -inf fill
// included), triu over diagonals on 2-D, batched and bool inputs, and causal_mask.
#include <cmath>

#include "op_cases.h"

namespace tessel::testing {

namespace {

// n's value at output index `idx` under numpy broadcasting.
double pick(const Nd& n, const std::vector<int64_t>& idx) {
  std::vector<int64_t> j(n.shape.size());
  size_t lead = idx.size() - n.shape.size();
  for (size_t d = 0; d < n.shape.size(); ++d) j[d] = n.shape[d] == 1 ? 0 : idx[lead + d];
  return n(j);
}

Tensor ref_where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Nd c(cond), x(a), y(b);
  Shape out = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "ref"), b.shape(), "ref");
  Nd r(out);
  Nd::for_each(out, [&](const std::vector<int64_t>& idx) { r(idx) = pick(c, idx) != 0 ? pick(x, idx) : pick(y, idx); });
  return r.tensor();
}

Tensor ref_masked_fill(const Tensor& x, const Tensor& mask, double value) {
  Nd a(x), m(mask);
  Nd r(x.shape());
  Nd::for_each(x.shape(), [&](const std::vector<int64_t>& idx) { r(idx) = pick(m, idx) != 0 ? value : a(idx); });
  return r.tensor();
}

// Keeps c - r >= diagonal in the last two dims; `dtype` is the output's (bool stays bool).
Tensor ref_triu(const Tensor& x, int64_t diagonal, DType dtype = DType::f64) {
  Nd a(x), r(x.shape());
  int64_t nd = x.dim();
  Nd::for_each(x.shape(), [&](const std::vector<int64_t>& idx) {
    r(idx) = idx[nd - 1] - idx[nd - 2] >= diagonal ? a(idx) : 0.0;
  });
  return r.tensor(dtype);
}

// bool [t, s]: true where j > i + (s - t).
Nd ref_causal(int64_t t, int64_t s) {
  Nd r(Shape{t, s});
  Nd::for_each(r.shape, [&](const std::vector<int64_t>& i) { r(i) = i[1] > i[0] + (s - t) ? 1.0 : 0.0; });
  return r;
}

struct WhereShape {
  const char* tag;
  Shape cond, a, b;
};
const WhereShape kWhereShapes[] = {
    {"same", {3, 4}, {3, 4}, {3, 4}},   {"broadcast", {3, 1}, {2, 1, 4}, {4}}, {"scalar_b", {2, 3}, {2, 3}, {}},
    {"cond_row", {4}, {3, 4}, {3, 1}},  {"empty", {0, 3}, {3}, {1, 3}},        {"size1", {1, 1}, {1}, {1, 1}},
};

struct FillShape {
  const char* tag;
  Shape x, mask;
  double value;
};
// The first two are the rule validator's: a zero fill (a Partial x may stay Partial) and not.
const FillShape kFillShapes[] = {
    {"zero_column", {2, 3, 4}, {3, 1}, 0.0}, {"row", {2, 3, 4}, {4}, -2.0},   {"same", {3, 4}, {3, 4}, 0.5},
    {"column", {2, 3, 4}, {3, 1}, 1e4},      {"scalar_mask", {2, 3}, {}, 3.0}, {"empty", {0, 4}, {4}, 1.0},
    {"size1", {1, 1}, {1, 1}, -1.0},
};

struct TriuShape {
  const char* tag;
  Shape x;
  int64_t diagonal;
};
// The first two are the rule validator's: batched and 2-D, off the main diagonal (sharded
// rows and columns move the local diagonal).
const TriuShape kTriuShapes[] = {
    {"3d_below", {2, 3, 4}, -1}, {"2d_above", {4, 5}, 1},    {"2d_main", {4, 5}, 0},      {"2d_below", {4, 5}, -1},
    {"2d_all_zero", {4, 5}, 7},  {"2d_all_kept", {4, 5}, -9}, {"3d_main", {2, 3, 4}, 0}, {"3d_above", {2, 4, 3}, 2},
    {"empty_rows", {0, 3}, 0},   {"empty_batch", {0, 2, 3}, 1}, {"size1", {1, 1}, 0},
};

}  // namespace

std::vector<OpCase> select_cases() {
  std::vector<OpCase> out;
  for (const WhereShape& s : kWhereShapes) {
    Shape sc = s.cond, sa = s.a, sb = s.b;
    out.push_back(OpCase{
        .name = fmt::format("where/{}", s.tag),
        .op = "where",
        .make_inputs =
            [sc, sa, sb](DType d) {
              return Tensors{mask_tensor(sc, 0.5, 61), rand_tensor(sa, d, 62), rand_tensor(sb, d, 63)};
            },
        .run = TESSEL_RUN1(where(in[0], in[1], in[2])),
        .reference = [](const Tensors& in) { return Tensors{ref_where(in[0], in[1], in[2])}; }});
  }

  for (const FillShape& s : kFillShapes) {
    Shape sx = s.x, sm = s.mask;
    double value = s.value;
    out.push_back(OpCase{
        .name = fmt::format("masked_fill/{}", s.tag),
        .op = "masked_fill",
        .make_inputs = [sx, sm](DType d) { return Tensors{rand_tensor(sx, d, 64), mask_tensor(sm, 0.4, 65)}; },
        .run = [value](const Tensors& in) { return Tensors{masked_fill(in[0], in[1], value)}; },
        .reference = [value](const Tensors& in) { return Tensors{ref_masked_fill(in[0], in[1], value)}; }});
  }
  // -inf as attention uses it. The raw output is checked by value (a loss through -inf has no
  // finite differences); exp of it gives 0 at masked places, and that path's gradient.
  out.push_back(OpCase{
      .name = "masked_fill/neg_inf",
      .op = "masked_fill",
      .make_inputs = [](DType d) { return Tensors{rand_tensor({2, 3, 4}, d, 66), mask_tensor({3, 4}, 0.5, 67)}; },
      .run = TESSEL_RUN1(masked_fill(in[0], in[1], -INFINITY)),
      .reference = [](const Tensors& in) { return Tensors{ref_masked_fill(in[0], in[1], -INFINITY)}; },
      .grad = false});
  out.push_back(OpCase{
      .name = "masked_fill/neg_inf_then_exp",
      .op = "masked_fill",
      .make_inputs = [](DType d) { return Tensors{rand_tensor({2, 3, 4}, d, 66), mask_tensor({3, 4}, 0.5, 67)}; },
      .run = TESSEL_RUN1(exp(masked_fill(in[0], in[1], -INFINITY))),
      .reference =
          [](const Tensors& in) {
            Nd r(ref_masked_fill(in[0], in[1], -INFINITY));
            for (double& v : r.v) v = std::exp(v);
            return Tensors{r.tensor()};
          }});

  for (const TriuShape& s : kTriuShapes) {
    Shape sx = s.x;
    int64_t diagonal = s.diagonal;
    out.push_back(OpCase{.name = fmt::format("triu/{}", s.tag),
                         .op = "triu",
                         .make_inputs = [sx](DType d) { return Tensors{rand_tensor(sx, d, 68)}; },
                         .run = [diagonal](const Tensors& in) { return Tensors{triu(in[0], diagonal)}; },
                         .reference = [diagonal](const Tensors& in) { return Tensors{ref_triu(in[0], diagonal)}; }});
  }
  // Bool inputs give false below the diagonal (no floating inputs: no gradient, no bf16).
  for (int64_t diagonal : {0, -1, 2}) {
    out.push_back(OpCase{
        .name = fmt::format("triu/bool_diag{}", diagonal < 0 ? "m1" : std::to_string(diagonal)),
        .op = "triu",
        .make_inputs = [](DType) { return Tensors{mask_tensor({2, 4, 5}, 0.7, 69)}; },
        .run = [diagonal](const Tensors& in) { return Tensors{triu(in[0], diagonal)}; },
        .reference = [diagonal](const Tensors& in) { return Tensors{ref_triu(in[0], diagonal, DType::b8)}; },
        .grad = false});
  }
  // causal_mask's values, square (s = -1) and with a longer or shorter key length.
  for (auto [t, s] : {std::pair<int64_t, int64_t>{4, -1}, {3, 5}, {5, 3}, {1, 1}, {0, 2}}) {
    out.push_back(OpCase{.name = fmt::format("triu/causal_mask_{}x{}", t, s < 0 ? "same" : std::to_string(s)),
                         .op = "triu",
                         .make_inputs = [](DType) { return Tensors{}; },
                         .run = [t, s](const Tensors&) { return Tensors{causal_mask(t, s)}; },
                         .reference = [t, s](const Tensors&) {
                           return Tensors{ref_causal(t, s < 0 ? t : s).tensor(DType::b8)};
                         },
                         .grad = false});
  }
  // causal_mask as attention uses it: hiding scores [B, T, S] of the future keys.
  out.push_back(OpCase{.name = "triu/causal_mask_fill",
                       .op = "triu",
                       .make_inputs = [](DType d) { return Tensors{rand_tensor({2, 3, 5}, d, 70)}; },
                       .run = TESSEL_RUN1(masked_fill(in[0], causal_mask(3, 5), -7.0)),
                       .reference = [](const Tensors& in) {
                         return Tensors{ref_masked_fill(in[0], ref_causal(3, 5).tensor(DType::b8), -7.0)};
                       }});
  return out;
}

std::vector<ErrorCase> select_errors() {
  return {
      {"where_cond_dtype", [] { where(Tensor::zeros({2}), Tensor::zeros({2}), Tensor::zeros({2})); },
       {"where", "condition", "f32", "bool"}},
      {"where_dtypes",
       [] { where(Tensor::zeros({2}, DType::b8), Tensor::zeros({2}, DType::f32), Tensor::zeros({2}, DType::f64)); },
       {"where", "f32", "f64"}},
      {"where_int",
       [] { where(Tensor::zeros({2}, DType::b8), Tensor::zeros({2}, DType::i64), Tensor::zeros({2}, DType::i64)); },
       {"where", "i64"}},
      {"where_shapes", [] { where(Tensor::zeros({2, 3}, DType::b8), Tensor::zeros({4}), Tensor::zeros({3})); },
       {"where", "[2, 3]", "[4]", "[3]"}},
      {"masked_fill_enlarges", [] { masked_fill(Tensor::zeros({3}), Tensor::zeros({2, 3}, DType::b8), 0.0); },
       {"masked_fill", "[3]", "[2, 3]"}},
      {"masked_fill_shape", [] { masked_fill(Tensor::zeros({2, 3}), Tensor::zeros({2}, DType::b8), 0.0); },
       {"masked_fill", "[2, 3]", "[2]"}},
      {"masked_fill_mask_dtype", [] { masked_fill(Tensor::zeros({2}), Tensor::zeros({2}, DType::i64), 0.0); },
       {"masked_fill", "mask", "i64", "bool"}},
      {"triu_1d", [] { triu(Tensor::zeros({4})); }, {"triu", "[4]", "at least 2"}},
      {"triu_int", [] { triu(Tensor::zeros({2, 2}, DType::i32)); }, {"triu", "i32"}},
      {"causal_mask_negative", [] { causal_mask(-2, 3); }, {"causal_mask", "t=-2", "s=3"}},
  };
}

}  // namespace tessel::testing
