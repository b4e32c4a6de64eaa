// Iteration over N strided operands of one shape: dims of size 1 are dropped and adjacent
// dims that are contiguous for every operand are merged, leaving an innermost run that
// kernels loop over with plain pointer strides (vectorisable when the strides are 1 or 0).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "tessel/core/shape.h"

namespace tessel {

template <size_t N>
class StridedLoop {
 public:
  using Offsets = std::array<int64_t, N>;

  StridedLoop(const Shape& shape, const std::array<const Shape*, N>& strides) {
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 0) {
        empty_ = true;
        return;
      }
      if (shape[d] == 1) continue;
      Dim dim{shape[d], {}};
      for (size_t k = 0; k < N; ++k) dim.stride[k] = (*strides[k])[d];
      if (!dims_.empty()) {
        Dim& prev = dims_.back();
        bool merge = true;
        for (size_t k = 0; k < N; ++k) merge = merge && prev.stride[k] == dim.stride[k] * dim.size;
        if (merge) {
          prev.size *= dim.size;
          prev.stride = dim.stride;
          continue;
        }
      }
      dims_.push_back(dim);
    }
    if (dims_.empty()) dims_.push_back(Dim{1, {}});
  }

  int64_t inner_size() const { return empty_ ? 0 : dims_.back().size; }
  Offsets inner_strides() const { return dims_.back().stride; }
  // Number of inner runs.
  int64_t outer_count() const {
    if (empty_) return 0;
    int64_t n = 1;
    for (size_t d = 0; d + 1 < dims_.size(); ++d) n *= dims_[d].size;
    return n;
  }
  // Calls fn(offsets, inner_size, inner_strides) for inner runs [begin, end).
  template <typename F>
  void run(int64_t begin, int64_t end, F&& fn) const {
    if (empty_ || begin >= end) return;
    const size_t outer = dims_.size() - 1;
    std::array<int64_t, 16> idx{};
    std::vector<int64_t> big_idx;
    int64_t* index = outer <= idx.size() ? idx.data() : (big_idx.resize(outer), big_idx.data());
    Offsets off{};
    int64_t rem = begin;
    for (size_t d = outer; d-- > 0;) {
      index[d] = rem % dims_[d].size;
      rem /= dims_[d].size;
      for (size_t k = 0; k < N; ++k) off[k] += index[d] * dims_[d].stride[k];
    }
    const Dim& inner = dims_.back();
    for (int64_t r = begin; r < end; ++r) {
      fn(off, inner.size, inner.stride);
      for (size_t d = outer; d-- > 0;) {
        for (size_t k = 0; k < N; ++k) off[k] += dims_[d].stride[k];
        if (++index[d] < dims_[d].size) break;
        for (size_t k = 0; k < N; ++k) off[k] -= dims_[d].stride[k] * dims_[d].size;
        index[d] = 0;
      }
    }
  }
  template <typename F>
  void run(F&& fn) const {
    run(0, outer_count(), fn);
  }

 private:
  struct Dim {
    int64_t size;
    Offsets stride;
  };
  std::vector<Dim> dims_;
  bool empty_ = false;
};

}  // namespace tessel
