// Comparisons the layout tests share.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "tessel/core/tensor.h"

namespace tessel {

// ‖a − b‖ / ‖b‖ over all elements (‖b‖ at least 1e-12).
inline double rel_diff(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_doubles(), y = b.to_doubles();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-12);
}

}  // namespace tessel
