// Cases for index.cc: embedding with i32 and i64 ids of several shapes (repeated ids check
// that the table gradient accumulates; first, as the rule validator runs the first two cases),
// a table piece with vocab_start (ids outside it give zero rows), and one_hot into several
// dtypes.
#include "op_cases.h"
#include "tessel/ops/op_list.h"

namespace tessel::testing {

namespace {

// out[..., d] = table[ids[...] - v0, d], or 0 when ids[...] - v0 is outside [0, V).
Tensor ref_embedding(const Tensor& table, const Tensor& ids, int64_t v0 = 0) {
  Nd t(table), i(ids);
  int64_t V = table.shape()[0], D = table.shape()[1];
  Shape shape = ids.shape();
  shape.push_back(D);
  Nd r(shape);
  for (int64_t n = 0; n < i.numel(); ++n) {
    int64_t v = static_cast<int64_t>(i.v[n]) - v0;
    if (v < 0 || v >= V) continue;
    for (int64_t d = 0; d < D; ++d) r.v[static_cast<size_t>(n * D + d)] = t({v, d});
  }
  return r.tensor();
}

// out[..., k] = k == ids[...], in `dtype`.
Tensor ref_one_hot(const Tensor& ids, int64_t K, DType dtype) {
  Nd i(ids);
  Shape shape = ids.shape();
  shape.push_back(K);
  Nd r(shape);
  for (int64_t n = 0; n < i.numel(); ++n) r.v[static_cast<size_t>(n * K + static_cast<int64_t>(i.v[n]))] = 1.0;
  return r.tensor(dtype);
}

struct EmbeddingShape {
  const char* tag;
  Shape table;
  Shape ids;
  DType id_dtype;
};
const EmbeddingShape kEmbeddingShapes[] = {
    {"i64_2d", {7, 3}, {2, 3}, DType::i64},    {"i32_1d", {5, 4}, {6}, DType::i32},
    {"scalar_id", {4, 2}, {}, DType::i64},     {"empty_ids", {4, 3}, {0, 2}, DType::i32},
    {"size1_table", {1, 1}, {3}, DType::i64},  {"empty_rows", {3, 0}, {2}, DType::i64},
};

}  // namespace

std::vector<OpCase> index_cases() {
  std::vector<OpCase> out;
  // Ids that repeat (and a row never used): the table gradient must add every use.
  auto repeated = [](DType id_dtype) {
    return OpCase{.name = fmt::format("embedding/repeated_{}", id_dtype),
                  .op = "embedding",
                  .make_inputs =
                      [id_dtype](DType d) {
                        return Tensors{rand_tensor({5, 3}, d, 83),
                                       Tensor::from_doubles({1, 3, 1, 4, 1, 0, 3, 1}, {2, 4}, id_dtype)};
                      },
                  .run = TESSEL_RUN1(embedding(in[0], in[1])),
                  .reference = [](const Tensors& in) { return Tensors{ref_embedding(in[0], in[1])}; }};
  };
  out.push_back(repeated(DType::i64));
  // A piece of a vocab-sharded table: rows [2, 7) of the whole one; ids outside it (some
  // repeated) give zero rows and no gradient.
  out.push_back(OpCase{.name = "embedding/vocab_start",
                       .op = "embedding",
                       .make_inputs =
                           [](DType d) {
                             return Tensors{rand_tensor({5, 3}, d, 85),
                                            Tensor::from_doubles({2, 0, 6, 7, 3, 9, 2, 1, 6}, {3, 3}, DType::i64)};
                           },
                       .run = TESSEL_RUN1(call_op1(op_embedding, {in[0], in[1]}, Attrs{{"vocab_start", int64_t{2}}})),
                       .reference = [](const Tensors& in) { return Tensors{ref_embedding(in[0], in[1], 2)}; }});
  out.push_back(repeated(DType::i32));
  for (const EmbeddingShape& s : kEmbeddingShapes) {
    Shape st = s.table, si = s.ids;
    DType id_dtype = s.id_dtype;
    out.push_back(OpCase{.name = fmt::format("embedding/{}", s.tag),
                         .op = "embedding",
                         .make_inputs =
                             [st, si, id_dtype](DType d) {
                               return Tensors{rand_tensor(st, d, 81), index_tensor(si, st[0], 82, id_dtype)};
                             },
                         .run = TESSEL_RUN1(embedding(in[0], in[1])),
                         .reference = [](const Tensors& in) { return Tensors{ref_embedding(in[0], in[1])}; }});
  }

  struct OneHot {
    const char* tag;
    Shape ids;
    DType id_dtype;
    int64_t K;
    DType dtype;
  };
  const OneHot one_hots[] = {
      {"i64", {2, 3}, DType::i64, 5, DType::i64},  {"f32", {4}, DType::i32, 3, DType::f32},
      {"f64", {2, 2}, DType::i64, 4, DType::f64},  {"bf16", {3}, DType::i64, 6, DType::bf16},
      {"bool", {2, 3}, DType::i32, 2, DType::b8},  {"i32", {}, DType::i64, 4, DType::i32},
      {"empty", {0}, DType::i64, 3, DType::f32},
  };
  for (const OneHot& s : one_hots) {
    Shape si = s.ids;
    DType id_dtype = s.id_dtype, dtype = s.dtype;
    int64_t K = s.K;
    out.push_back(OpCase{.name = fmt::format("one_hot/{}", s.tag),
                         .op = "one_hot",
                         .make_inputs = [si, id_dtype, K](DType) { return Tensors{index_tensor(si, K, 84, id_dtype)}; },
                         .run = [K, dtype](const Tensors& in) { return Tensors{one_hot(in[0], K, dtype)}; },
                         .reference = [K, dtype](const Tensors& in) { return Tensors{ref_one_hot(in[0], K, dtype)}; },
                         .grad = false,
                         .keeps_dtype = false});
  }
  return out;
}

std::vector<ErrorCase> index_errors() {
  auto ids = [](std::vector<double> v) {
    Shape s{static_cast<int64_t>(v.size())};
    return Tensor::from_doubles(v, s, DType::i64);
  };
  return {
      {"embedding_id_too_big", [ids] { embedding(Tensor::zeros({5, 3}), ids({0, 7, 1})); },
       {"embedding", "id 7", "V=5"}},
      {"embedding_id_negative", [ids] { embedding(Tensor::zeros({5, 3}), ids({2, -1})); },
       {"embedding", "id -1", "V=5"}},
      {"embedding_table_1d", [ids] { embedding(Tensor::zeros({5}), ids({0})); }, {"embedding", "[5]", "2 dims"}},
      {"embedding_float_ids", [] { embedding(Tensor::zeros({5, 3}), Tensor::zeros({2})); },
       {"embedding", "f32", "i64"}},
      {"embedding_int_table", [ids] { embedding(Tensor::zeros({5, 3}, DType::i64), ids({0})); },
       {"embedding", "i64", "floating"}},
      {"one_hot_id_too_big", [ids] { one_hot(ids({1, 3}), 3); }, {"one_hot", "id 3", "num_classes=3"}},
      {"one_hot_id_negative", [ids] { one_hot(ids({-2}), 3); }, {"one_hot", "id -2", "num_classes=3"}},
      {"one_hot_classes", [ids] { one_hot(ids({0}), 0); }, {"one_hot", "num_classes=0"}},
      {"one_hot_float_ids", [] { one_hot(Tensor::zeros({2}, DType::f64), 3); }, {"one_hot", "f64"}},
  };
}

}  // namespace tessel::testing
