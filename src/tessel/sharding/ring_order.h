// Context parallel's load-balanced order of a sequence (ring attention, Megatron-Core's causal
// load balance): cut into 2n chunks, cp rank r of n holds chunks r and 2n-1-r, in that order,
// so under a causal mask every rank has the same work. The data loader lays tokens out this
// way (parallel/data.h), ring attention computes on it (dist/ring_attention.cc), and dropout
// draws its masks at the natural positions it maps back to (ops/random.cc).
#pragma once

#include <cstdint>

namespace tessel {

// The natural chunk that local half `half` (0 or 1) of cp rank `rank` of `ranks` holds.
inline int64_t ring_chunk(int64_t rank, int64_t ranks, int64_t half) { return half == 0 ? rank : 2 * ranks - 1 - rank; }

// The natural position of position `s` of a sequence of `length` held in the ring's order over
// `ranks` (length a multiple of 2·ranks).
inline int64_t ring_natural_position(int64_t s, int64_t length, int64_t ranks) {
  const int64_t c = length / (2 * ranks), held = s / c;  // the held chunk: rank held / 2, half held % 2
  return ring_chunk(held / 2, ranks, held % 2) * c + s % c;
}

}  // namespace tessel
