// Cases for softmax.cc: softmax and log_softmax over the last, first and middle dim, rows
// longer than the vector lanes, size-1 and size-0 dims, rows with -inf entries; cross_entropy
// with mean and sum, ignored targets (the default -100 and an in-range index), i32 and i64
// targets, 3-D logits and all targets ignored. The rule validator runs the first two cases of
// each op, so the most demanding shapes come first.
#include <cmath>

#include "op_cases.h"
#include "tessel/ops/op_list.h"

namespace tessel::testing {

namespace {

// y = softmax(x) (or log_softmax) along `dim`, by loops over each line of the dim.
Tensor ref_softmax(const Tensor& x, int64_t dim, bool log) {
  Nd a(x), r(x.shape());
  int64_t d = dim < 0 ? dim + x.dim() : dim;
  Shape lines = x.shape();
  lines[d] = 1;
  Nd::for_each(lines, [&](const std::vector<int64_t>& idx) {
    std::vector<int64_t> j = idx;
    double m = -INFINITY;
    for (j[d] = 0; j[d] < x.shape()[d]; ++j[d]) m = std::max(m, a(j));
    double s = 0;
    for (j[d] = 0; j[d] < x.shape()[d]; ++j[d]) s += std::exp(a(j) - m);
    for (j[d] = 0; j[d] < x.shape()[d]; ++j[d]) r(j) = log ? a(j) - m - std::log(s) : std::exp(a(j) - m) / s;
  });
  return r.tensor();
}

// Mean or sum over rows of lse(logits[r, :]) - logits[r, t[r]], skipping t[r] == ignore.
Tensor ref_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore, bool mean) {
  Nd x(logits), t(targets);
  int64_t C = logits.shape().back(), R = t.numel();
  double total = 0, count = 0;
  for (int64_t r = 0; r < R; ++r) {
    int64_t target = static_cast<int64_t>(t.v[r]);
    if (target == ignore) continue;
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, x.v[r * C + c]);
    for (int64_t c = 0; c < C; ++c) s += std::exp(x.v[r * C + c] - m);
    total += m + std::log(s) - x.v[r * C + target];
    count += 1;
  }
  return Tensor::scalar(mean ? total / count : total, DType::f64);
}

struct SoftmaxShape {
  const char* tag;
  Shape x;
  int64_t dim;
  bool grad = true;
};
// A middle dim first: shards before and after it.
const SoftmaxShape kSoftmaxShapes[] = {
    {"middle", {2, 4, 3}, 1},
    {"last", {3, 5}, -1},
    {"first", {4, 3}, 0},
    {"long_rows", {2, 37}, 1},          // past the 16 partial sums, with a remainder
    {"wide_inner", {2, 3, 70}, 1, false},  // more inner columns than one block
    {"size1_dim", {3, 1}, -1},
    {"size1_rows", {1, 4}, 0},
    {"empty_dim", {3, 0}, 1},
    {"empty_rows", {0, 4}, -1},
    {"empty_middle", {2, 0, 3}, 1},
    {"vector", {6}, 0},
};

// Logits with -inf entries: row 0 partly, row 2 entirely when `all_row`.
Tensor with_neg_inf(DType dtype, bool all_row) {
  Nd a(rand_tensor({3, 4}, DType::f64, 33));
  a({0, 1}) = -INFINITY;
  a({0, 3}) = -INFINITY;
  a({1, 0}) = -INFINITY;
  if (all_row)
    for (int64_t j = 0; j < 4; ++j) a({2, j}) = -INFINITY;
  return a.tensor(dtype);
}

Tensor targets_of(const std::vector<double>& v, const Shape& shape, DType dtype) {
  return Tensor::from_doubles(v, shape, dtype);
}

}  // namespace

// -Σ p · log_softmax(x) along `dim`, summed over the rows, divided by their count for mean.
Tensor ref_cross_entropy_soft(const Tensor& logits, const Tensor& probs, int64_t dim, bool mean) {
  Nd lp(ref_softmax(logits, dim, true)), p(probs);
  double total = 0;
  for (size_t i = 0; i < lp.v.size(); ++i) total -= p.v[i] * lp.v[i];
  const int64_t C = logits.shape()[static_cast<size_t>(dim)];
  return Tensor::scalar(mean ? total / static_cast<double>(lp.numel() / C) : total, DType::f64);
}

// logits with `dim` moved last (the reference for a class dim elsewhere).
Tensor dim_last(const Tensor& x, int64_t dim) {
  Nd a(x);
  Shape out;
  for (size_t d = 0; d < x.shape().size(); ++d)
    if (static_cast<int64_t>(d) != dim) out.push_back(x.shape()[d]);
  out.push_back(x.shape()[static_cast<size_t>(dim)]);
  Nd r(out);
  Nd::for_each(x.shape(), [&](const std::vector<int64_t>& idx) {
    std::vector<int64_t> j;
    for (size_t d = 0; d < idx.size(); ++d)
      if (static_cast<int64_t>(d) != dim) j.push_back(idx[d]);
    j.push_back(idx[static_cast<size_t>(dim)]);
    r(j) = a(idx);
  });
  return r.tensor();
}

std::vector<OpCase> softmax_cases() {
  std::vector<OpCase> out;
  // Soft-label cross-entropy (a composition over log_softmax): first among log_softmax's
  // cases, so the rule validator runs it sharded; class dims last and first.
  for (int64_t dim : {1, 0}) {
    const Shape shape = dim == 1 ? Shape{3, 5} : Shape{4, 3};
    const bool mean = dim == 1;
    out.push_back(OpCase{
        .name = fmt::format("log_softmax/soft_label_cross_entropy_dim{}", dim),
        .op = "log_softmax",
        .make_inputs = [shape](DType d) { return Tensors{rand_tensor(shape, d, 36, -2.0, 2.0), rand_tensor(shape, d, 37, 0.0, 1.0)}; },
        .run =
            [dim, mean](const Tensors& in) {
              return Tensors{cross_entropy_soft(in[0], in[1], mean ? Reduction::mean : Reduction::sum, dim)};
            },
        .reference = [dim, mean](const Tensors& in) { return Tensors{ref_cross_entropy_soft(in[0], in[1], dim, mean)}; }});
  }
  for (bool log : {false, true}) {
    const char* op = log ? "log_softmax" : "softmax";
    for (const SoftmaxShape& s : kSoftmaxShapes) {
      Shape shape = s.x;
      int64_t dim = s.dim;
      out.push_back(OpCase{
          .name = fmt::format("{}/{}", op, s.tag),
          .op = op,
          .make_inputs = [shape](DType d) { return Tensors{rand_tensor(shape, d, 31, -3.0, 3.0)}; },
          .run = [dim, log](const Tensors& in) { return Tensors{log ? log_softmax(in[0], dim) : softmax(in[0], dim)}; },
          .reference = [dim, log](const Tensors& in) { return Tensors{ref_softmax(in[0], dim, log)}; },
          .grad = s.grad});
    }
    // Partly -inf rows: those entries get probability 0 (and gradient 0). log_softmax keeps
    // -inf outputs, which finite differences cannot weigh, so it checks the forward only.
    out.push_back(OpCase{.name = fmt::format("{}/neg_inf", op),
                         .op = op,
                         .make_inputs = [](DType d) { return Tensors{with_neg_inf(d, false)}; },
                         .run = [log](const Tensors& in) { return Tensors{log ? log_softmax(in[0]) : softmax(in[0])}; },
                         .reference = [log](const Tensors& in) { return Tensors{ref_softmax(in[0], -1, log)}; },
                         .grad = !log});
    // A row of all -inf gives NaN, as in PyTorch.
    out.push_back(OpCase{.name = fmt::format("{}/all_neg_inf_row", op),
                         .op = op,
                         .make_inputs = [](DType d) { return Tensors{with_neg_inf(d, true)}; },
                         .run = [log](const Tensors& in) { return Tensors{log ? log_softmax(in[0]) : softmax(in[0])}; },
                         .reference = [log](const Tensors& in) { return Tensors{ref_softmax(in[0], -1, log)}; },
                         .grad = false});
  }

  struct CeCase {
    const char* tag;
    Shape logits;
    std::vector<double> targets;
    DType target_dtype;
    int64_t ignore;
    bool mean;
  };
  // The class dim not last ([B, C, T], PyTorch's layout): first, so the rule validator runs it.
  out.push_back(OpCase{
      .name = "cross_entropy/class_dim1",
      .op = "cross_entropy",
      .make_inputs =
          [](DType d) {
            return Tensors{rand_tensor({2, 4, 3}, d, 38, -2.0, 2.0), targets_of({0, 3, -100, 1, 2, 3}, {2, 3}, DType::i64)};
          },
      .run = TESSEL_RUN1(cross_entropy(in[0], in[1], -100, Reduction::mean, 1)),
      .reference = [](const Tensors& in) { return Tensors{ref_cross_entropy(dim_last(in[0], 1), in[1], -100, true)}; }});
  // 3-D logits with ignored targets, rows and classes that split unevenly and into empty
  // pieces, mean (global count) and sum.
  for (const CeCase& ce : {
           CeCase{"btc_mean_i32", {2, 3, 4}, {0, 3, -100, 1, 2, 3}, DType::i32, -100, true},
           CeCase{"btc_sum_ignore_in_range", {3, 2, 3}, {1, 0, 2, 1, 2, 0}, DType::i64, 1, false},
           CeCase{"mean_i64", {4, 5}, {1, 4, -100, 0}, DType::i64, -100, true},
           CeCase{"sum_i32", {4, 5}, {1, -100, 3, 0}, DType::i32, -100, false},
           CeCase{"ignore_in_range", {4, 5}, {2, 0, 2, 3}, DType::i64, 2, true},
           CeCase{"btc_sum_i64", {2, 3, 4}, {3, 3, 0, -100, -100, 1}, DType::i64, -100, false},
           CeCase{"long_rows", {2, 37}, {36, 5}, DType::i64, -100, true},
           CeCase{"single_row", {5}, {3}, DType::i64, -100, true},
       }) {
    Shape lead(ce.logits.begin(), ce.logits.end() - 1);
    out.push_back(OpCase{
        .name = fmt::format("cross_entropy/{}", ce.tag),
        .op = "cross_entropy",
        .make_inputs =
            [ce, lead](DType d) {
              return Tensors{rand_tensor(ce.logits, d, 34, -2.0, 2.0), targets_of(ce.targets, lead, ce.target_dtype)};
            },
        .run =
            [ce](const Tensors& in) {
              return Tensors{cross_entropy(in[0], in[1], ce.ignore, ce.mean ? Reduction::mean : Reduction::sum)};
            },
        .reference = [ce](const Tensors& in) { return Tensors{ref_cross_entropy(in[0], in[1], ce.ignore, ce.mean)}; }});
  }
  // Every target ignored with mean: 0 / 0 = NaN, as in PyTorch.
  out.push_back(OpCase{.name = "cross_entropy/all_ignored",
                       .op = "cross_entropy",
                       .make_inputs =
                           [](DType d) {
                             return Tensors{rand_tensor({2, 3}, d, 35), targets_of({-100, -100}, {2}, DType::i64)};
                           },
                       .run = TESSEL_RUN1(cross_entropy(in[0], in[1])),
                       .reference = [](const Tensors&) { return Tensors{Tensor::scalar(NAN, DType::f64)}; },
                       .grad = false});
  return out;
}

std::vector<ErrorCase> softmax_errors() {
  return {
      {"softmax_dim", [] { softmax(Tensor::zeros({2, 3}), 2); }, {"softmax", "dim 2", "2 dims"}},
      {"log_softmax_dim", [] { log_softmax(Tensor::zeros({2, 3}), -3); }, {"log_softmax", "dim -3", "2 dims"}},
      {"softmax_int", [] { softmax(Tensor::zeros({2, 3}, DType::i64)); }, {"softmax", "i64"}},
      {"cross_entropy_target_range",
       [] { cross_entropy(Tensor::zeros({3, 5}), Tensor::from_doubles({1, 7, 0}, {3}, DType::i64)); },
       {"cross_entropy", "target 7", "C=5"}},
      {"cross_entropy_negative_target",
       [] { cross_entropy(Tensor::zeros({2, 5}), Tensor::from_doubles({-1, 0}, {2}, DType::i32)); },
       {"cross_entropy", "target -1", "C=5"}},
      {"cross_entropy_shape",
       [] { cross_entropy(Tensor::zeros({2, 3, 5}), Tensor::zeros({2, 4}, DType::i64)); },
       {"cross_entropy", "i64[2, 4]", "[2, 3]", "f32[2, 3, 5]"}},
      {"cross_entropy_float_targets",
       [] { cross_entropy(Tensor::zeros({2, 5}), Tensor::zeros({2})); },
       {"cross_entropy", "f32", "i32 or i64"}},
      {"cross_entropy_int_logits",
       [] { cross_entropy(Tensor::zeros({2, 5}, DType::i64), Tensor::zeros({2}, DType::i64)); },
       {"cross_entropy", "i64", "floating"}},
      {"cross_entropy_reduction",
       [] {
         call_op1(op_cross_entropy, {Tensor::zeros({2, 5}), Tensor::zeros({2}, DType::i64)},
                  Attrs{{"ignore_index", int64_t{-100}}, {"reduction", std::string("avg")}});
       },
       {"cross_entropy", "'avg'"}},
  };
}

}  // namespace tessel::testing
