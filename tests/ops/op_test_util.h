// Helpers for op tests: deterministic inputs, a plain N-d array for writing references with
// loops over doubles, and tensor comparison.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tessel/core/tensor.h"

namespace tessel::testing {

// Uniform values in [lo, hi) from the counter RNG (deterministic per seed).
Tensor rand_tensor(const Shape& shape, DType dtype, uint64_t seed, double lo = -1.0, double hi = 1.0);
// Integers in [0, n) of dtype i64 (or i32).
Tensor index_tensor(const Shape& shape, int64_t n, uint64_t seed, DType dtype = DType::i64);
// Bools, true with probability p.
Tensor mask_tensor(const Shape& shape, double p, uint64_t seed);
// The same values laid out non-contiguously (every other element of a wider buffer, and
// with the last two dims stored transposed when there are two or more).
Tensor noncontiguous(const Tensor& t);

// A dense row-major array of doubles for references written as loops.
struct Nd {
  Shape shape;
  std::vector<double> v;

  Nd() = default;
  explicit Nd(const Tensor& t) : shape(t.shape()), v(t.to_doubles()) {}
  explicit Nd(Shape s, double fill = 0.0) : shape(std::move(s)), v(static_cast<size_t>(shape_numel(shape)), fill) {}

  int64_t numel() const { return static_cast<int64_t>(v.size()); }
  int64_t offset(const std::vector<int64_t>& idx) const;
  double& operator()(const std::vector<int64_t>& idx) { return v[static_cast<size_t>(offset(idx))]; }
  double operator()(const std::vector<int64_t>& idx) const { return v[static_cast<size_t>(offset(idx))]; }
  Tensor tensor(DType dtype = DType::f64) const { return Tensor::from_doubles(v, shape, dtype); }
  // Calls fn(index) for every multi-index of `shape` in row-major order.
  static void for_each(const Shape& shape, const std::function<void(const std::vector<int64_t>&)>& fn);
};

// Max |a-b| / (atol + rtol·|b|) over elements; <= 1 means close. Shapes must match.
double closeness(const Tensor& actual, const Tensor& expected, double rtol, double atol);
// gtest-friendly: empty when close, else a message with the worst element.
std::string compare(const Tensor& actual, const Tensor& expected, double rtol, double atol);

}  // namespace tessel::testing
