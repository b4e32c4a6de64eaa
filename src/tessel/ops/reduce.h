// Reductions and scans along dims.
#pragma once

#include <utility>
#include <vector>

#include "tessel/core/tensor.h"

namespace tessel {

// Sum/mean/max over `dims` (empty: all dims), keeping them as size 1 when keepdim. The
// gradient of max goes to the first maximal element of each reduced group.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor max(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Min over `dims`, as max: the gradient goes to the first minimal element of each group.
Tensor min(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Index (i64) of the first maximal element along `dim`.
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
// The k largest (or smallest) elements along `dim`, sorted, and their i64 indices; ties keep
// the lower index first.
std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true);
// Inclusive prefix sum along `dim`.
Tensor cumsum(const Tensor& x, int64_t dim);

}  // namespace tessel
