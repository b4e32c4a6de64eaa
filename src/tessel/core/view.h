// Raw views and copies: reinterpret a tensor's storage with another shape/strides, or copy
// between layouts and dtypes. None of these record autograd history; the differentiable
// versions are ops (reshape, permute, slice, expand, contiguous, ...).
#pragma once

#include <optional>
#include <vector>

#include "tessel/core/tensor.h"

namespace tessel::view {

Tensor as_strided(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset);
// Elements start, start+step, ... < end along `dim` (negative start/end count from the end).
Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
// Index `index` along `dim`, dropping the dim.
Tensor select(const Tensor& t, int64_t dim, int64_t index);
Tensor permute(const Tensor& t, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& t, int64_t dim0, int64_t dim1);
// Resolves one -1 in `shape` against `numel`; throws naming `op` on mismatch.
Shape infer_reshape(const Shape& shape, int64_t numel, std::string_view op);
// A view with `shape` when the strides allow it, else nullopt.
std::optional<Tensor> try_view(const Tensor& t, const Shape& shape);
// A view when possible, else a contiguous copy.
Tensor reshape(const Tensor& t, const Shape& shape);
// Broadcasts size-1 dims (and prepends dims) with stride 0.
Tensor expand(const Tensor& t, const Shape& shape);
Tensor unsqueeze(const Tensor& t, int64_t dim);
Tensor squeeze(const Tensor& t, int64_t dim);
// The tensor itself when contiguous, else a contiguous copy.
Tensor contiguous(const Tensor& t);
// A contiguous copy (always new storage).
Tensor clone(const Tensor& t);
// Copies `src` (broadcast to dst's shape, converted to dst's dtype) into `dst`.
void copy(const Tensor& dst, const Tensor& src);
// A contiguous copy converted to `dtype` (the tensor itself if already that dtype and contiguous).
Tensor to_dtype(const Tensor& t, DType dtype);
// Fills every element of `t` with `value`.
void fill(const Tensor& t, double value);

}  // namespace tessel::view
