// Cases for random.cc: dropout with p = 0 and p = 0.3 on whole tensors and on blocks placed
// inside a larger global tensor. References draw the mask themselves from uniform_f32_at at
// each element's global linear index.
#include "op_cases.h"
#include "tessel/core/philox.h"

namespace tessel::testing {

namespace {

constexpr uint64_t kSeed = 1234;
constexpr uint64_t kStream = 0x9e3779b97f4a7c15ull;  // any 64-bit value: high bits must reach Philox too

// out = u(k) < p ? 0 : x / (1 - p), k = the global linear index of each local element.
Tensor ref_dropout(const Tensor& x, double p, const GlobalBox& box) {
  Nd a(x), r(x.shape());
  const Shape& global = box.global_shape.empty() ? x.shape() : box.global_shape;
  Nd::for_each(x.shape(), [&](const std::vector<int64_t>& idx) {
    int64_t k = 0;
    for (size_t d = 0; d < idx.size(); ++d) k = k * global[d] + idx[d] + (box.offset.empty() ? 0 : box.offset[d]);
    bool drop = uniform_f32_at(kSeed, kStream, static_cast<uint64_t>(k)) < p;
    r(idx) = drop ? 0.0 : a(idx) / (1.0 - p);
  });
  return r.tensor();
}

struct DropoutShape {
  const char* tag;
  Shape x;
  double p;
  GlobalBox box;
};
// The first two are the rule validator's: a block inside a larger tensor (the rank's box is
// composed with it) and a whole tensor.
const DropoutShape kDropoutShapes[] = {
    {"box_3d", {2, 2, 3}, 0.3, {{3, 4, 5}, {1, 0, 2}}},
    {"p03", {4, 5}, 0.3, {}},
    {"p0", {3, 4}, 0.0, {}},
    {"p03_3d", {2, 3, 4}, 0.3, {}},
    {"p03_scalar", {}, 0.3, {}},
    {"p03_empty", {0, 4}, 0.3, {}},
    {"p03_size1", {1, 1}, 0.3, {}},
    {"box_2d", {3, 2}, 0.3, {{5, 6}, {1, 2}}},
    {"box_rows", {2, 6}, 0.3, {{5, 6}, {3, 0}}},
    {"box_p0", {2, 3}, 0.0, {{4, 4}, {2, 1}}},
};

}  // namespace

std::vector<OpCase> random_cases() {
  std::vector<OpCase> out;
  for (const DropoutShape& s : kDropoutShapes) {
    Shape sx = s.x;
    double p = s.p;
    GlobalBox box = s.box;
    out.push_back(OpCase{.name = fmt::format("dropout/{}", s.tag),
                         .op = "dropout",
                         .make_inputs = [sx](DType d) { return Tensors{rand_tensor(sx, d, 91)}; },
                         .run = [p, box](const Tensors& in) { return Tensors{dropout(in[0], p, kSeed, kStream, box)}; },
                         .reference = [p, box](const Tensors& in) { return Tensors{ref_dropout(in[0], p, box)}; }});
  }
  return out;
}

std::vector<ErrorCase> random_errors() {
  return {
      {"dropout_p_one", [] { dropout(Tensor::zeros({2, 3}), 1.0, kSeed, kStream); }, {"dropout", "p=1", "[0, 1)"}},
      {"dropout_p_negative", [] { dropout(Tensor::zeros({2, 3}), -0.25, kSeed, kStream); }, {"dropout", "p=-0.25"}},
      {"dropout_int", [] { dropout(Tensor::zeros({2}, DType::i64), 0.5, kSeed, kStream); }, {"dropout", "i64"}},
      {"dropout_box_rank", [] { dropout(Tensor::zeros({2, 3}), 0.5, kSeed, kStream, {{6}, {0}}); },
       {"dropout", "[2, 3]", "[6]"}},
      {"dropout_box_overflow", [] { dropout(Tensor::zeros({2, 3}), 0.5, kSeed, kStream, {{4, 4}, {1, 2}}); },
       {"dropout", "[2, 3]", "[1, 2]", "[4, 4]"}},
  };
}

}  // namespace tessel::testing
