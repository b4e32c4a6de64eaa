// Upper bounds on the sizes a user can ask for, and multiplication that refuses to wrap.
//
// Counts a user writes (devices, nodes, model widths, batch and sequence sizes) are read as
// 64-bit numbers and multiplied only through checked_mul, so a huge value is refused with an
// error naming it instead of wrapping into a small or negative count (a cluster of 2^31 devices
// once planned as a handful). The bounds are documented in docs/plan.md and docs/training.md.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>

namespace tessel {

// Devices (ranks) of a cluster or of a layout's dp x tp x pp, and nodes of a cluster: 2^20,
// about ten times the largest training clusters built so far. Small enough that any product of
// two degrees fits an int64 and one degree fits an int.
inline constexpr int64_t kMaxDevices = int64_t{1} << 20;

// Elements of one tensor, or of any product of sizes that counts elements (vocabulary x width,
// batch x sequence x width): 2^48, a petabyte of float32 values — beyond any device, far below
// where int64 arithmetic on element counts and byte offsets could wrap.
inline constexpr int64_t kMaxElements = int64_t{1} << 48;

// a * b, or nothing when the product leaves the int64 range.
inline std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// The product of `factors`, or nothing when it exceeds `most` (or wraps on the way there).
// Factors are expected non-negative.
inline std::optional<int64_t> checked_product(std::initializer_list<int64_t> factors, int64_t most) {
  int64_t out = 1;
  for (int64_t f : factors) {
    std::optional<int64_t> next = checked_mul(out, f);
    if (!next || *next > most) return std::nullopt;
    out = *next;
  }
  return out;
}

}  // namespace tessel
