// Cases for matmul.cc: plain, transposed, batched, broadcast batches, empty and thin shapes;
// linear with both weight layouts, with and without bias. And grouped_matmul.cc: groups of
// several sizes, an empty one, the weight in both layouts.
#include "op_cases.h"

namespace tessel::testing {

namespace {

// out[..., m, n] = Σ_k A[..., m, k] B[..., k, n] with A = a or a^T (last two dims), batch
// dims broadcast.
Tensor ref_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  Nd x(a), y(b);
  size_t na = a.shape().size(), nb = b.shape().size();
  int64_t M = ta ? a.shape()[na - 1] : a.shape()[na - 2];
  int64_t K = ta ? a.shape()[na - 2] : a.shape()[na - 1];
  int64_t N = tb ? b.shape()[nb - 2] : b.shape()[nb - 1];
  Shape ba(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  Shape out = broadcast_shapes(ba, bb, "ref");
  out.push_back(M);
  out.push_back(N);
  Nd r(out);
  Nd::for_each(out, [&](const std::vector<int64_t>& idx) {
    size_t nd = idx.size();
    auto batch_index = [&](const Shape& bs, size_t n_total) {
      std::vector<int64_t> j(n_total);
      size_t lead = (nd - 2) - bs.size();
      for (size_t d = 0; d < bs.size(); ++d) j[d] = bs[d] == 1 ? 0 : idx[lead + d];
      return j;
    };
    std::vector<int64_t> ia = batch_index(ba, na), ib = batch_index(bb, nb);
    double s = 0;
    for (int64_t k = 0; k < K; ++k) {
      ia[na - 2] = ta ? k : idx[nd - 2];
      ia[na - 1] = ta ? idx[nd - 2] : k;
      ib[nb - 2] = tb ? idx[nd - 1] : k;
      ib[nb - 1] = tb ? k : idx[nd - 1];
      s += x(ia) * y(ib);
    }
    r(idx) = s;
  });
  return r.tensor();
}

// The output dims of a linear weight: w[1:] (in_out, one or several) or w[0].
Shape linear_out(const Shape& w, bool in_out) { return in_out ? Shape(w.begin() + 1, w.end()) : Shape{w[0]}; }

// y[..., o] = Σ_i x[..., i] W[i, o] + bias[o], o running over all output dims in order.
Tensor ref_linear(const Tensor& x, const Tensor& w, const Tensor* bias, bool in_out) {
  Nd xn(x), wn(w);
  const Shape od = linear_out(w.shape(), in_out);
  int64_t I = x.shape().back(), O = shape_numel(od);
  Shape out(x.shape().begin(), x.shape().end() - 1);
  out.insert(out.end(), od.begin(), od.end());
  Nd r(out);
  Nd b = bias ? Nd(*bias) : Nd(Shape{O}, 0.0);
  int64_t rows = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t o = 0; o < O; ++o) {
      double s = b.v[o];
      for (int64_t i = 0; i < I; ++i) s += xn.v[row * I + i] * (in_out ? wn.v[i * O + o] : wn.v[o * I + i]);
      r.v[row * O + o] = s;
    }
  return r.tensor();
}

struct MatmulShape {
  const char* tag;
  Shape a, b;
  bool ta, tb;
};
const MatmulShape kMatmulShapes[] = {
    {"plain", {3, 4}, {4, 5}, false, false},
    {"trans_a", {4, 3}, {4, 5}, true, false},
    {"trans_b", {3, 4}, {5, 4}, false, true},
    {"trans_ab", {4, 3}, {5, 4}, true, true},
    {"batched", {2, 3, 4}, {2, 4, 5}, false, false},
    {"batched_trans_b", {2, 3, 4}, {2, 5, 4}, false, true},
    {"broadcast_batch", {2, 1, 3, 4}, {3, 4, 2}, false, false},
    {"batched_by_matrix", {2, 3, 4}, {4, 5}, false, false},
    {"matrix_by_batched", {3, 4}, {2, 4, 5}, false, false},
    {"empty_k", {3, 0}, {0, 2}, false, false},
    {"empty_m", {0, 4}, {4, 2}, false, false},
    {"thin", {1, 4}, {4, 1}, false, false},
};

}  // namespace

// y[rows of group e] = x[rows of group e] @ W_e, W_e = w[e] or w[e]^T.
Tensor ref_grouped_matmul(const Tensor& x, const Tensor& w, const std::vector<int64_t>& counts, bool trans_w) {
  Nd a(x), b(w);
  const int64_t K = x.shape()[1], F = trans_w ? w.shape()[1] : w.shape()[2];
  Nd r(Shape{x.shape()[0], F});
  int64_t row = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    for (int64_t i = row; i < row + counts[e]; ++i)
      for (int64_t f = 0; f < F; ++f) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k)
          s += a({i, k}) * (trans_w ? b({static_cast<int64_t>(e), f, k}) : b({static_cast<int64_t>(e), k, f}));
        r({i, f}) = s;
      }
    row += counts[e];
  }
  return r.tensor();
}

std::vector<OpCase> matmul_cases() {
  std::vector<OpCase> out;
  for (const bool trans_w : {false, true}) {
    const std::vector<int64_t> counts = {2, 0, 3, 1};
    out.push_back(OpCase{
        .name = fmt::format("grouped_matmul/{}", trans_w ? "trans_w" : "plain"),
        .op = "grouped_matmul",
        .make_inputs =
            [trans_w](DType d) {
              return Tensors{rand_tensor({6, 5}, d, 13), rand_tensor(trans_w ? Shape{4, 3, 5} : Shape{4, 5, 3}, d, 14)};
            },
        .run = [counts, trans_w](const Tensors& in) { return Tensors{grouped_matmul(in[0], in[1], counts, trans_w)}; },
        .reference =
            [counts, trans_w](const Tensors& in) { return Tensors{ref_grouped_matmul(in[0], in[1], counts, trans_w)}; },
        .f32_rtol = 1e-4,
        .f32_atol = 1e-5});
  }
  for (const MatmulShape& s : kMatmulShapes) {
    Shape sa = s.a, sb = s.b;
    bool ta = s.ta, tb = s.tb;
    out.push_back(OpCase{
        .name = fmt::format("matmul/{}", s.tag),
        .op = "matmul",
        .make_inputs = [sa, sb](DType d) { return Tensors{rand_tensor(sa, d, 11), rand_tensor(sb, d, 12)}; },
        .run = [ta, tb](const Tensors& in) { return Tensors{matmul(in[0], in[1], ta, tb)}; },
        .reference = [ta, tb](const Tensors& in) { return Tensors{ref_matmul(in[0], in[1], ta, tb)}; },
        .f32_rtol = 1e-4,
        .f32_atol = 1e-5});
  }
  struct LinearCase {
    const char* tag;
    Shape x, w;
    bool bias, in_out;
  };
  for (LinearCase l : {LinearCase{"out_in_bias", {2, 3, 4}, {5, 4}, true, false},
                       LinearCase{"in_out_bias", {2, 3, 4}, {4, 5}, true, true},
                       LinearCase{"no_bias", {3, 4}, {5, 4}, false, false},
                       LinearCase{"vector", {4}, {5, 4}, true, false},
                       LinearCase{"empty_rows", {0, 4}, {5, 4}, true, false},
                       LinearCase{"empty_features", {3, 0}, {5, 0}, true, false},
                       // Several output dims (GPT-2's c_attn [C, 3, C]): y[..., 3, 2].
                       LinearCase{"in_out_3d_bias", {2, 3, 4}, {4, 3, 2}, true, true},
                       LinearCase{"in_out_3d", {3, 4}, {4, 2, 3}, false, true}}) {
    out.push_back(OpCase{
        .name = fmt::format("linear/{}", l.tag),
        .op = "linear",
        .make_inputs =
            [l](DType d) {
              Tensors in{rand_tensor(l.x, d, 13), rand_tensor(l.w, d, 14)};
              if (l.bias) in.push_back(rand_tensor(linear_out(l.w, l.in_out), d, 15));
              return in;
            },
        .run = [l](const Tensors& in) { return Tensors{linear(in[0], in[1], l.bias ? in[2] : Tensor(), l.in_out)}; },
        .reference = [l](const Tensors& in) { return Tensors{ref_linear(in[0], in[1], l.bias ? &in[2] : nullptr, l.in_out)}; },
        .f32_rtol = 1e-4,
        .f32_atol = 1e-5});
  }
  return out;
}

std::vector<ErrorCase> matmul_errors() {
  return {
      {"matmul_inner", [] { matmul(Tensor::zeros({2, 3}), Tensor::zeros({4, 5})); }, {"matmul", "[2, 3]", "[4, 5]"}},
      {"matmul_vector", [] { matmul(Tensor::zeros({3}), Tensor::zeros({3, 5})); }, {"matmul", "at least 2", "[3]"}},
      {"matmul_batch", [] { matmul(Tensor::zeros({2, 3, 4}), Tensor::zeros({3, 4, 5})); }, {"matmul", "[2]", "[3]"}},
      {"linear_features", [] { linear(Tensor::zeros({2, 3}), Tensor::zeros({5, 4})); }, {"linear", "[2, 3]", "[5, 4]"}},
      {"linear_bias", [] { linear(Tensor::zeros({2, 4}), Tensor::zeros({5, 4}), Tensor::zeros({4})); }, {"linear", "bias", "[4]"}},
      {"linear_bias_3d", [] { linear(Tensor::zeros({2, 4}), Tensor::zeros({4, 3, 2}), Tensor::zeros({6}), true); },
       {"linear", "bias", "[6]", "[3, 2]"}},
      {"linear_out_in_3d", [] { linear(Tensor::zeros({2, 4}), Tensor::zeros({3, 2, 4})); }, {"linear", "[3, 2, 4]"}},
      {"grouped_matmul_counts", [] { grouped_matmul(Tensor::zeros({5, 4}), Tensor::zeros({2, 4, 3}), {2, 2}); },
       {"grouped_matmul", "[2, 2]", "4 rows", "x has 5"}},
      {"grouped_matmul_groups", [] { grouped_matmul(Tensor::zeros({4, 4}), Tensor::zeros({2, 4, 3}), {4}); },
       {"grouped_matmul", "1 counts for 2 groups"}},
      {"grouped_matmul_k", [] { grouped_matmul(Tensor::zeros({4, 5}), Tensor::zeros({2, 4, 3}), {2, 2}); },
       {"grouped_matmul", "K=5", "K=4"}},
      {"grouped_matmul_negative", [] { grouped_matmul(Tensor::zeros({2, 4}), Tensor::zeros({2, 4, 3}), {3, -1}); },
       {"grouped_matmul", "negative count -1"}},
  };
}

}  // namespace tessel::testing
