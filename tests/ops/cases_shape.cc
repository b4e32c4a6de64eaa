// Cases for shape.cc: reshape (and its compositions), permute/transpose, expand, contiguous,
// cat/stack, split/chunk, slice/narrow.
#include "op_cases.h"

namespace tessel::testing {

namespace {

// The input's values with a new shape (row-major order kept).
Tensors same_values(const Tensor& x, const Shape& shape) {
  Nd a(x);
  a.shape = shape;
  return {a.tensor()};
}

Tensor ref_permute(const Tensor& x, const std::vector<int64_t>& dims) {
  Nd a(x);
  Shape out;
  for (int64_t d : dims) out.push_back(x.shape()[d]);
  Nd r(out);
  Nd::for_each(out, [&](const std::vector<int64_t>& idx) {
    std::vector<int64_t> j(idx.size());
    for (size_t i = 0; i < dims.size(); ++i) j[dims[i]] = idx[i];
    r(idx) = a(j);
  });
  return r.tensor();
}

Tensor ref_slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  Nd a(x);
  Shape out = x.shape();
  out[dim] = (end - start + step - 1) / step;
  Nd r(out);
  Nd::for_each(out, [&](const std::vector<int64_t>& idx) {
    std::vector<int64_t> j = idx;
    j[dim] = start + idx[dim] * step;
    r(idx) = a(j);
  });
  return r.tensor();
}

Tensor ref_cat(const Tensors& xs, int64_t dim) {
  Shape out = xs[0].shape();
  out[dim] = 0;
  for (const Tensor& x : xs) out[dim] += x.shape()[dim];
  Nd r(out);
  int64_t at = 0;
  for (const Tensor& x : xs) {
    Nd a(x);
    Nd::for_each(x.shape(), [&](const std::vector<int64_t>& idx) {
      std::vector<int64_t> j = idx;
      j[dim] += at;
      r(j) = a(idx);
    });
    at += x.shape()[dim];
  }
  return r.tensor();
}

}  // namespace

std::vector<OpCase> shape_cases() {
  std::vector<OpCase> out;
  auto input = [](Shape s, uint64_t seed) { return [s, seed](DType d) { return Tensors{rand_tensor(s, d, seed)}; }; };

  // The rule validator runs the first two cases of each op: these two split a sharded dim
  // ([6] -> [2, 3]), merge one ([4, 5] -> [20], [4, 6] -> [8, 3]) and move size-1 dims.
  out.push_back({.name = "reshape/split_merge", .op = "reshape", .make_inputs = input({6, 4, 1, 5}, 53),
                 .run = TESSEL_RUN1(reshape(in[0], {2, 3, 1, -1})),
                 .reference = [](const Tensors& in) { return same_values(in[0], {2, 3, 1, 20}); }});
  out.push_back({.name = "reshape/regroup", .op = "reshape", .make_inputs = input({4, 1, 6}, 54),
                 .run = TESSEL_RUN1(reshape(in[0], {8, 1, 3})),
                 .reference = [](const Tensors& in) { return same_values(in[0], {8, 1, 3}); }});
  out.push_back({.name = "reshape/basic", .op = "reshape", .make_inputs = input({2, 6}, 31),
                 .run = TESSEL_RUN1(reshape(in[0], {3, 4})),
                 .reference = [](const Tensors& in) { return same_values(in[0], {3, 4}); }});
  out.push_back({.name = "reshape/infer", .op = "reshape", .make_inputs = input({2, 3, 4}, 32),
                 .run = TESSEL_RUN1(reshape(in[0], {-1, 4})),
                 .reference = [](const Tensors& in) { return same_values(in[0], {6, 4}); }});
  out.push_back({.name = "reshape/flatten", .op = "reshape", .make_inputs = input({2, 3, 4}, 33),
                 .run = TESSEL_RUN1(flatten(in[0], 1)),
                 .reference = [](const Tensors& in) { return same_values(in[0], {2, 12}); }});
  out.push_back({.name = "reshape/unsqueeze_squeeze", .op = "reshape", .make_inputs = input({3, 1, 2}, 34),
                 .run = TESSEL_RUN1(unsqueeze(squeeze(in[0], 1), 0)),
                 .reference = [](const Tensors& in) { return same_values(in[0], {1, 3, 2}); }});
  out.push_back({.name = "reshape/empty", .op = "reshape", .make_inputs = input({0, 4}, 35),
                 .run = TESSEL_RUN1(reshape(in[0], {2, 0, 2})),
                 .reference = [](const Tensors& in) { return same_values(in[0], {2, 0, 2}); }});

  out.push_back({.name = "permute/3d", .op = "permute", .make_inputs = input({2, 3, 4}, 36),
                 .run = TESSEL_RUN1(permute(in[0], {2, 0, 1})),
                 .reference = [](const Tensors& in) { return Tensors{ref_permute(in[0], {2, 0, 1})}; }});
  out.push_back({.name = "permute/transpose", .op = "permute", .make_inputs = input({3, 5}, 37),
                 .run = TESSEL_RUN1(transpose(in[0], 0, 1)),
                 .reference = [](const Tensors& in) { return Tensors{ref_permute(in[0], {1, 0})}; }});
  // A permuted view fed to an op that needs contiguity: exercises the backward's inverse.
  out.push_back({.name = "permute/then_reshape", .op = "permute", .make_inputs = input({2, 3, 4}, 38),
                 .run = TESSEL_RUN1(reshape(permute(in[0], {1, 2, 0}), {3, 8})),
                 .reference = [](const Tensors& in) {
                   Tensor p = ref_permute(in[0], {1, 2, 0});
                   return same_values(p, {3, 8});
                 }});

  // New leading dims, a broadcast dim, kept dims (a size-1 one among them) and -1.
  out.push_back({.name = "expand/keep_and_new", .op = "expand", .make_inputs = input({2, 1, 3, 1}, 55),
                 .run = TESSEL_RUN1(expand(in[0], {4, -1, 5, 3, 1})),
                 .reference = [](const Tensors& in) {
                   Nd a(in[0]), r(Shape{4, 2, 5, 3, 1});
                   Nd::for_each(r.shape, [&](const std::vector<int64_t>& i) { r(i) = a({i[1], 0, i[3], 0}); });
                   return Tensors{r.tensor()};
                 }});
  out.push_back({.name = "expand/broadcast", .op = "expand", .make_inputs = input({3, 1}, 39),
                 .run = TESSEL_RUN1(expand(in[0], {2, 3, 4})),
                 .reference = [](const Tensors& in) {
                   Nd a(in[0]), r(Shape{2, 3, 4});
                   Nd::for_each(r.shape, [&](const std::vector<int64_t>& i) { r(i) = a({i[1], 0}); });
                   return Tensors{r.tensor()};
                 }});
  out.push_back({.name = "contiguous/transposed", .op = "contiguous", .make_inputs = input({3, 4}, 40),
                 .run = TESSEL_RUN1(contiguous(transpose(in[0], 0, 1))),
                 .reference = [](const Tensors& in) { return Tensors{ref_permute(in[0], {1, 0})}; }});

  out.push_back({.name = "cat/dim0", .op = "cat",
                 .make_inputs = [](DType d) { return Tensors{rand_tensor({2, 3}, d, 41), rand_tensor({1, 3}, d, 42), rand_tensor({0, 3}, d, 43)}; },
                 .run = TESSEL_RUN1(cat(in, 0)),
                 .reference = [](const Tensors& in) { return Tensors{ref_cat(in, 0)}; }});
  out.push_back({.name = "cat/dim1", .op = "cat",
                 .make_inputs = [](DType d) { return Tensors{rand_tensor({2, 3}, d, 44), rand_tensor({2, 2}, d, 45)}; },
                 .run = TESSEL_RUN1(cat(in, -1)),
                 .reference = [](const Tensors& in) { return Tensors{ref_cat(in, 1)}; }});
  out.push_back({.name = "cat/stack", .op = "cat",
                 .make_inputs = [](DType d) { return Tensors{rand_tensor({2, 3}, d, 46), rand_tensor({2, 3}, d, 47)}; },
                 .run = TESSEL_RUN1(stack(in, 1)),
                 .reference = [](const Tensors& in) {
                   Nd a(in[0]), b(in[1]), r(Shape{2, 2, 3});
                   Nd::for_each(r.shape, [&](const std::vector<int64_t>& i) { r(i) = i[1] == 0 ? a({i[0], i[2]}) : b({i[0], i[2]}); });
                   return Tensors{r.tensor()};
                 }});

  out.push_back({.name = "split/sizes", .op = "split", .make_inputs = input({3, 5}, 48),
                 .run = [](const Tensors& in) { return split(in[0], {1, 0, 4}, 1); },
                 .reference = [](const Tensors& in) {
                   return Tensors{ref_slice(in[0], 1, 0, 1, 1), ref_slice(in[0], 1, 1, 1, 1), ref_slice(in[0], 1, 1, 5, 1)};
                 }});
  // Only one chunk used downstream: the others get no gradient and must count as zeros.
  out.push_back({.name = "split/chunk_partial_use", .op = "split", .make_inputs = input({5, 2}, 49),
                 .run = [](const Tensors& in) { return Tensors{chunk(in[0], 3, 0)[1]}; },
                 .reference = [](const Tensors& in) { return Tensors{ref_slice(in[0], 0, 2, 4, 1)}; }});

  out.push_back({.name = "slice/step", .op = "slice", .make_inputs = input({7, 3}, 50),
                 .run = TESSEL_RUN1(slice(in[0], 0, 1, 7, 2)),
                 .reference = [](const Tensors& in) { return Tensors{ref_slice(in[0], 0, 1, 7, 2)}; }});
  // The whole dim (negative dim and start): a sharded dim may stay sharded.
  out.push_back({.name = "slice/whole_negative", .op = "slice", .make_inputs = input({3, 5}, 56),
                 .run = TESSEL_RUN1(slice(in[0], -1, -5, 5)),
                 .reference = [](const Tensors& in) { return Tensors{ref_slice(in[0], 1, 0, 5, 1)}; }});
  out.push_back({.name = "slice/negative", .op = "slice", .make_inputs = input({3, 6}, 51),
                 .run = TESSEL_RUN1(slice(in[0], -1, -4, -1)),
                 .reference = [](const Tensors& in) { return Tensors{ref_slice(in[0], 1, 2, 5, 1)}; }});
  out.push_back({.name = "slice/narrow_empty", .op = "slice", .make_inputs = input({3, 6}, 52),
                 .run = TESSEL_RUN1(narrow(in[0], 1, 2, 0)),
                 .reference = [](const Tensors& in) { return Tensors{ref_slice(in[0], 1, 2, 2, 1)}; }});
  return out;
}

std::vector<ErrorCase> shape_errors() {
  return {
      {"reshape_numel", [] { reshape(Tensor::zeros({2, 3}), {4}); }, {"reshape", "[4]", "6"}},
      {"reshape_two_infer", [] { reshape(Tensor::zeros({2, 3}), {-1, -1}); }, {"reshape", "-1"}},
      {"permute_repeat", [] { permute(Tensor::zeros({2, 3}), {0, 0}); }, {"permute", "repeats"}},
      {"expand_bad", [] { expand(Tensor::zeros({2, 3}), {4, 3}); }, {"expand", "[2, 3]", "[4, 3]"}},
      {"cat_shapes", [] { cat({Tensor::zeros({2, 3}), Tensor::zeros({2, 4})}, 0); }, {"cat", "[2, 4]", "[2, 3]"}},
      {"split_sizes", [] { split(Tensor::zeros({2, 5}), {2, 2}, 1); }, {"split", "[2,2]", "size 5"}},
      {"slice_step", [] { slice(Tensor::zeros({4}), 0, 0, 4, 0); }, {"slice", "step"}},
  };
}

}  // namespace tessel::testing
