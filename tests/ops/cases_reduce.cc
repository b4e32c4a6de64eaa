// Cases for reduce.cc: sum/mean/max/min over dim sets (adjacent, split, all, empty dims), argmax,
// topk (largest and smallest) and cumsum.
#include <algorithm>
#include <numeric>

#include "op_cases.h"

namespace tessel::testing {

namespace {

enum class Kind { sum, mean, max, min };

Tensor ref_reduce(const Tensor& x, std::vector<int64_t> dims, bool keepdim, Kind kind) {
  Nd a(x);
  int64_t nd = x.dim();
  if (dims.empty())
    for (int64_t d = 0; d < nd; ++d) dims.push_back(d);
  for (int64_t& d : dims) d = d < 0 ? d + nd : d;
  auto reduced = [&](int64_t d) { return std::find(dims.begin(), dims.end(), d) != dims.end(); };
  Shape kept;
  for (int64_t d = 0; d < nd; ++d) kept.push_back(reduced(d) ? 1 : x.shape()[d]);
  Nd r(kept, kind == Kind::max ? -INFINITY : kind == Kind::min ? INFINITY : 0.0);
  Nd count(kept, 0.0);
  Nd::for_each(x.shape(), [&](const std::vector<int64_t>& idx) {
    std::vector<int64_t> j = idx;
    for (int64_t d = 0; d < nd; ++d)
      if (reduced(d)) j[d] = 0;
    double v = a(idx);
    if (kind == Kind::max) r(j) = std::max(r(j), v);
    else if (kind == Kind::min) r(j) = std::min(r(j), v);
    else r(j) += v;
    count(j) += 1;
  });
  if (kind == Kind::mean)
    for (size_t i = 0; i < r.v.size(); ++i) r.v[i] /= count.v[i];
  Shape out;
  for (int64_t d = 0; d < nd; ++d)
    if (!reduced(d) || keepdim) out.push_back(kept[d]);
  r.shape = out;
  return r.tensor();
}

struct ReduceShape {
  const char* tag;
  Shape x;
  std::vector<int64_t> dims;
  bool keepdim;
};
const ReduceShape kReduceShapes[] = {
    {"all", {3, 4}, {}, false},           {"last", {3, 4}, {-1}, false},     {"first_keep", {3, 4}, {0}, true},
    {"middle", {2, 3, 4}, {1}, false},    {"split_dims", {2, 3, 4}, {0, 2}, true},
    {"adjacent", {2, 3, 4}, {1, 2}, false}, {"size1", {1, 5}, {0}, false},
};

Tensor ref_cumsum(const Tensor& x, int64_t dim) {
  Nd a(x), r(x.shape());
  int64_t d = dim < 0 ? dim + x.dim() : dim;
  Nd::for_each(x.shape(), [&](const std::vector<int64_t>& idx) {
    std::vector<int64_t> j = idx;
    double s = 0;
    for (int64_t k = 0; k <= idx[d]; ++k) {
      j[d] = k;
      s += a(j);
    }
    r(idx) = s;
  });
  return r.tensor();
}

}  // namespace

std::vector<OpCase> reduce_cases() {
  std::vector<OpCase> out;
  for (auto [kind, name] : {std::pair{Kind::sum, "sum"}, std::pair{Kind::mean, "mean"}, std::pair{Kind::max, "max"},
                            std::pair{Kind::min, "min"}})
    for (const ReduceShape& s : kReduceShapes) {
      Shape shape = s.x;
      std::vector<int64_t> dims = s.dims;
      bool keep = s.keepdim;
      Kind k = kind;
      out.push_back(OpCase{
          .name = fmt::format("{}/{}", name, s.tag),
          .op = name,
          .make_inputs = [shape](DType d) { return Tensors{rand_tensor(shape, d, 21)}; },
          .run =
              [dims, keep, k](const Tensors& in) {
                if (k == Kind::sum) return Tensors{sum(in[0], dims, keep)};
                if (k == Kind::mean) return Tensors{mean(in[0], dims, keep)};
                if (k == Kind::min) return Tensors{min(in[0], dims, keep)};
                return Tensors{max(in[0], dims, keep)};
              },
          .reference = [dims, keep, k](const Tensors& in) { return Tensors{ref_reduce(in[0], dims, keep, k)}; },
          .f32_rtol = 1e-5,
          .f32_atol = 1e-5});
    }
  out.push_back(OpCase{.name = "sum/empty",
                       .op = "sum",
                       .make_inputs = [](DType d) { return Tensors{rand_tensor({0, 3}, d, 22)}; },
                       .run = TESSEL_RUN1(sum(in[0], {0})),
                       .reference = [](const Tensors&) { return Tensors{Tensor::zeros({3}, DType::f64)}; }});

  for (auto [dim, keep] : {std::pair<int64_t, bool>{1, false}, std::pair<int64_t, bool>{0, true}}) {
    out.push_back(OpCase{
        .name = fmt::format("argmax/dim{}{}", dim, keep ? "_keep" : ""),
        .op = "argmax",
        .make_inputs = [](DType d) { return Tensors{rand_tensor({3, 5}, d, 23)}; },
        .run = [dim, keep](const Tensors& in) { return Tensors{argmax(in[0], dim, keep)}; },
        .reference =
            [dim, keep](const Tensors& in) {
              Nd a(in[0]);
              Shape out = in[0].shape();
              out[dim] = 1;
              Nd r(out);
              Nd::for_each(out, [&](const std::vector<int64_t>& idx) {
                std::vector<int64_t> j = idx;
                int64_t best = 0;
                for (int64_t k = 0; k < in[0].shape()[dim]; ++k) {
                  j[dim] = k;
                  std::vector<int64_t> jb = idx;
                  jb[dim] = best;
                  if (a(j) > a(jb)) best = k;
                }
                r(idx) = static_cast<double>(best);
              });
              if (!keep) out.erase(out.begin() + dim);
              r.shape = out;
              return Tensors{r.tensor(DType::i64)};
            },
        .grad = false});
  }

  for (bool largest : {true, false}) {
    out.push_back(OpCase{
        .name = fmt::format("topk/{}", largest ? "largest" : "smallest"),
        .op = "topk",
        .make_inputs = [](DType d) { return Tensors{rand_tensor({3, 6}, d, 24)}; },
        .run =
            [largest](const Tensors& in) {
              auto [v, i] = topk(in[0], 3, -1, largest);
              return Tensors{v, i};
            },
        .reference =
            [largest](const Tensors& in) {
              Nd a(in[0]);
              Nd v(Shape{3, 3}), ix(Shape{3, 3});
              for (int64_t r = 0; r < 3; ++r) {
                std::vector<int64_t> order(6);
                std::iota(order.begin(), order.end(), 0);
                std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) {
                  return largest ? a({r, p}) > a({r, q}) : a({r, p}) < a({r, q});
                });
                for (int64_t j = 0; j < 3; ++j) {
                  v({r, j}) = a({r, order[j]});
                  ix({r, j}) = static_cast<double>(order[j]);
                }
              }
              return Tensors{v.tensor(), ix.tensor(DType::i64)};
            },
        .bf16 = false});  // bf16 rounding can reorder near-equal values
  }

  for (int64_t dim : {1, 0}) {
    out.push_back(OpCase{.name = fmt::format("cumsum/dim{}", dim),
                         .op = "cumsum",
                         .make_inputs = [](DType d) { return Tensors{rand_tensor({3, 4}, d, 25)}; },
                         .run = [dim](const Tensors& in) { return Tensors{cumsum(in[0], dim)}; },
                         .reference = [dim](const Tensors& in) { return Tensors{ref_cumsum(in[0], dim)}; }});
  }
  return out;
}

std::vector<ErrorCase> reduce_errors() {
  return {
      {"sum_dim", [] { sum(Tensor::zeros({2, 3}), {5}); }, {"sum", "dim 5", "2 dims"}},
      {"sum_repeat", [] { sum(Tensor::zeros({2, 3}), {1, -1}); }, {"sum", "repeats"}},
      {"max_empty", [] { max(Tensor::zeros({0, 3}), {0}); }, {"max", "f32[0, 3]"}},
      {"topk_k", [] { topk(Tensor::zeros({2, 3}), 4); }, {"topk", "k=4", "size 3"}},
      {"argmax_dim", [] { argmax(Tensor::zeros({2, 3}), 2); }, {"argmax", "dim 2"}},
  };
}

}  // namespace tessel::testing
