// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011). Every value is a pure
// function of (seed, stream, index): the stream names what is being drawn (a parameter
// name, a dropout site and step) and the index is the element's position in the *global*
// tensor. Filling any slice or shard of a tensor therefore gives exactly that slice of
// filling the whole tensor, which is what makes results independent of the layout.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "tessel/core/tensor.h"

namespace tessel {

using PhiloxBlock = std::array<uint32_t, 4>;

// The raw generator: 4 words for (counter, key).
PhiloxBlock philox4x32_10(PhiloxBlock counter, std::array<uint32_t, 2> key);

// The 4 words for element `index` of `stream` under `seed`.
PhiloxBlock philox_at(uint64_t seed, uint64_t stream, uint64_t index);
// philox_at for indices first .. first + n - 1, written to words[4·i .. 4·i + 3]: the same
// values, computed 16 blocks at a time in vector lanes (attention's dropout masks).
void philox_blocks(uint64_t seed, uint64_t stream, uint64_t first, int64_t n, uint32_t* words);

// A 64-bit stream key from a name (FNV-1a, then a SplitMix64 finaliser).
uint64_t stream_key(std::string_view name);
// Combines a stream key with a number (step, micro-batch, layer...).
uint64_t stream_combine(uint64_t stream, uint64_t value);

// Uniform in [0, 1) with 24 random bits (f32) or 53 random bits (f64).
float uniform_f32_at(uint64_t seed, uint64_t stream, uint64_t index);
double uniform_f64_at(uint64_t seed, uint64_t stream, uint64_t index);
// Standard normal by Box-Muller from the element's own block.
double normal_at(uint64_t seed, uint64_t stream, uint64_t index);

// Where a local tensor sits inside a global one: the global shape and the offset of the
// local block along each dim. Empty means the tensor is the whole global tensor.
struct GlobalBox {
  Shape global_shape;
  Shape offset;
};

enum class Distribution { uniform, normal };

// Fills floating `t` with values of the distribution drawn at each element's global index:
// uniform in [a, b) or normal with mean a and std b.
void rng_fill(const Tensor& t, Distribution dist, double a, double b, uint64_t seed, uint64_t stream,
              const GlobalBox& box = {});

// Calls fn(local_begin, global_begin, length) for every row (innermost-dim run) of a
// contiguous local block of `local_shape` placed by `box`: local elements local_begin + i
// sit at global linear index global_begin + i. Rows are split over the rank's threads.
void for_each_global_row(const Shape& local_shape, const GlobalBox& box,
                         const std::function<void(int64_t local_begin, int64_t global_begin, int64_t length)>& fn);

}  // namespace tessel
