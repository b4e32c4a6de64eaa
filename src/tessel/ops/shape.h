// Shape manipulation: views where the layout allows, copies otherwise.
#pragma once

#include <vector>

#include "tessel/core/tensor.h"

namespace tessel {

// Same elements in `shape` (one -1 is inferred); a view when the strides allow.
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
// Broadcasts size-1 dims (and new leading dims) to `shape` without copying.
Tensor expand(const Tensor& x, const Shape& shape);
Tensor contiguous(const Tensor& x);
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
Tensor stack(const std::vector<Tensor>& xs, int64_t dim);
// Pieces of the given sizes along `dim` (the sizes must sum to the dim).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
// `chunks` balanced pieces along `dim` (sizes differ by at most one, larger first).
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim);
// Elements start, start+step, ... < end along `dim`; negative start/end count from the end.
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
inline Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  return slice(x, dim, start, start + length);
}

}  // namespace tessel
