// Shapes and strides: plain vectors of int64 with the helpers every layer needs
// (element counts, contiguous strides, broadcasting, dim normalisation).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessel {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
// Row-major strides of a contiguous tensor of `shape`, in elements.
Shape contiguous_strides(const Shape& shape);
// "[2, 3]".
std::string shape_str(const Shape& shape);
// Parses "8,6", "[8, 6]" or "8x6"; throws naming the text.
Shape parse_shape(std::string_view text);

// Broadcast two shapes numpy-style; throws naming `op` and both shapes when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op);
// Maps a possibly negative `dim` into [0, ndim); throws naming `op` when out of range.
int64_t normalize_dim(int64_t dim, int64_t ndim, std::string_view op);
// Normalises, sorts and de-duplicates a dim list; an empty list means "all dims".
std::vector<int64_t> normalize_dims(const std::vector<int64_t>& dims, int64_t ndim, std::string_view op);

// Balanced split of `n` into `k` parts (numpy's array_split): sizes differ by at most one,
// larger parts first. Used for chunk, uneven sharding and data slicing.
int64_t split_size(int64_t n, int64_t k, int64_t index);
int64_t split_offset(int64_t n, int64_t k, int64_t index);

}  // namespace tessel
