// Shape helpers.
#include "tessel/core/shape.h"

#include <algorithm>
#include <charconv>

#include "tessel/core/error.h"

namespace tessel {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

Shape parse_shape(std::string_view text) {
  Shape out;
  std::string_view rest = text;
  auto is_sep = [](char c) { return c == ',' || c == 'x' || c == ' ' || c == '[' || c == ']'; };
  while (!rest.empty()) {
    while (!rest.empty() && is_sep(rest.front())) rest.remove_prefix(1);
    if (rest.empty()) break;
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), v);
    TESSEL_CHECK(ec == std::errc() && v >= 0, "bad shape '{}': expected non-negative integers like 8,6", text);
    rest.remove_prefix(static_cast<size_t>(ptr - rest.data()));
    out.push_back(v);
  }
  return out;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    TESSEL_CHECK(da == db || da == 1 || db == 1, "{}: shapes {} and {} cannot be broadcast (dim {}: {} vs {})", op,
                 shape_str(a), shape_str(b), i, da, db);
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int64_t normalize_dim(int64_t dim, int64_t ndim, std::string_view op) {
  int64_t d = dim < 0 ? dim + ndim : dim;
  TESSEL_CHECK(d >= 0 && d < ndim, "{}: dim {} out of range for a tensor of {} dims", op, dim, ndim);
  return d;
}

std::vector<int64_t> normalize_dims(const std::vector<int64_t>& dims, int64_t ndim, std::string_view op) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < ndim; ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) out.push_back(normalize_dim(d, ndim, op));
  std::sort(out.begin(), out.end());
  TESSEL_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), "{}: dim list [{}] repeats a dim", op,
               fmt::join(dims, ", "));
  return out;
}

int64_t split_size(int64_t n, int64_t k, int64_t index) { return n / k + (index < n % k ? 1 : 0); }

int64_t split_offset(int64_t n, int64_t k, int64_t index) {
  return index * (n / k) + std::min(index, n % k);
}

}  // namespace tessel
