// Op test helpers.
#include "op_test_util.h"

#include <cmath>

#include "tessel/core/philox.h"
#include "tessel/core/view.h"

namespace tessel::testing {

Tensor rand_tensor(const Shape& shape, DType dtype, uint64_t seed, double lo, double hi) {
  Tensor t = Tensor::empty(shape, DType::f64);
  rng_fill(t, Distribution::uniform, lo, hi, seed, stream_key("test-input"));
  return view::to_dtype(t, dtype);
}

Tensor index_tensor(const Shape& shape, int64_t n, uint64_t seed, DType dtype) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<double>(static_cast<int64_t>(uniform_f64_at(seed, stream_key("test-index"), i) * static_cast<double>(n)));
  return Tensor::from_doubles(v, shape, dtype);
}

Tensor mask_tensor(const Shape& shape, double p, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = uniform_f64_at(seed, stream_key("test-mask"), i) < p ? 1.0 : 0.0;
  return Tensor::from_doubles(v, shape, DType::b8);
}

Tensor noncontiguous(const Tensor& t) {
  if (t.dim() == 0) return t;
  // Store with the last two dims swapped and the (new) last dim doubled, then view back.
  Shape store = t.shape();
  if (t.dim() >= 2) std::swap(store[store.size() - 1], store[store.size() - 2]);
  Shape wide = store;
  wide.back() *= 2;
  Tensor buf = Tensor::zeros(wide, t.dtype());
  Tensor strided = view::slice(buf, -1, 0, wide.back(), 2);
  Tensor logical = t.dim() >= 2 ? view::transpose(strided, -1, -2) : strided;
  view::copy(logical, t);
  return logical;
}

int64_t Nd::offset(const std::vector<int64_t>& idx) const {
  int64_t off = 0;
  for (size_t d = 0; d < shape.size(); ++d) off = off * shape[d] + idx[d];
  return off;
}

void Nd::for_each(const Shape& shape, const std::function<void(const std::vector<int64_t>&)>& fn) {
  int64_t n = shape_numel(shape);
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t k = 0; k < n; ++k) {
    fn(idx);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

double closeness(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  std::vector<double> a = actual.to_doubles(), b = expected.to_doubles();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::isinf(b[i]) && a[i] == b[i]) continue;
    double r = std::fabs(a[i] - b[i]) / (atol + rtol * std::fabs(b[i]));
    if (!(r <= worst)) worst = std::isnan(r) ? INFINITY : r;
  }
  return worst;
}

std::string compare(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  if (actual.shape() != expected.shape())
    return fmt::format("shape {} != expected {}", shape_str(actual.shape()), shape_str(expected.shape()));
  std::vector<double> a = actual.to_doubles(), b = expected.to_doubles();
  size_t worst_i = 0;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::isinf(b[i]) && a[i] == b[i]) continue;
    double r = std::fabs(a[i] - b[i]) / (atol + rtol * std::fabs(b[i]));
    if (!(r <= worst)) {
      worst = std::isnan(r) ? INFINITY : r;
      worst_i = i;
    }
  }
  if (worst <= 1.0) return "";
  return fmt::format("element {} of {}: got {:.10g}, expected {:.10g} (rtol {}, atol {})", worst_i, a.size(), a[worst_i],
                     b[worst_i], rtol, atol);
}

}  // namespace tessel::testing
