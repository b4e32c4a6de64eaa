// The byte-level reduction kernels every backend shares (reduce.h).
#include "tessel/comm/reduce.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "tessel/core/convert.h"
#include "tessel/core/error.h"

namespace tessel {

namespace {

template <typename T, typename F>
void combine(T* __restrict a, const T* __restrict x, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) a[i] = f(a[i], x[i]);
}

template <typename T>
void reduce_typed(T* a, const T* x, int64_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      if constexpr (std::is_same_v<T, bool>) combine(a, x, n, [](T u, T v) { return u || v; });
      else combine(a, x, n, [](T u, T v) { return static_cast<T>(u + v); });
      return;
    case ReduceOp::max: combine(a, x, n, [](T u, T v) { return v > u ? v : u; }); return;
    case ReduceOp::min: combine(a, x, n, [](T u, T v) { return v < u ? v : u; }); return;
    case ReduceOp::prod:
      if constexpr (std::is_same_v<T, bool>) combine(a, x, n, [](T u, T v) { return u && v; });
      else combine(a, x, n, [](T u, T v) { return static_cast<T>(u * v); });
      return;
  }
}

}  // namespace

void check_reducible(DType dtype, ReduceOp op, const std::string& where) {
  TESSEL_CHECK(!(dtype == DType::b8 && op == ReduceOp::avg), "{}: cannot average bool values", where);
}

void reduce_into(void* acc, const void* x, int64_t n, DType dtype, ReduceOp op) {
  if (dtype == DType::bf16) {
    auto* a = static_cast<BFloat16*>(acc);
    const auto* b = static_cast<const BFloat16*>(x);
    for (int64_t i = 0; i < n; ++i) {
      float u = static_cast<float>(a[i]), v = static_cast<float>(b[i]);
      reduce_typed(&u, &v, 1, op);
      a[i] = BFloat16(u);
    }
    return;
  }
  TESSEL_DISPATCH_ALL(dtype, "reduce", [&]<typename T>() {
    if constexpr (!std::is_same_v<T, BFloat16>) reduce_typed(static_cast<T*>(acc), static_cast<const T*>(x), n, op);
  });
}

void reduce_ranks(const std::vector<const void*>& srcs, const std::vector<void*>& dsts, int64_t src_off,
                  int64_t dst_off, int64_t n, DType dtype, ReduceOp op) {
  const size_t esz = dtype_size(dtype);
  const int64_t tile = 4096;
  const DType acc_type = dtype == DType::bf16 ? DType::f32 : dtype;
  const size_t acc_esz = dtype_size(acc_type);
  thread_local std::vector<char> acc_buf, conv_buf;
  acc_buf.resize(static_cast<size_t>(tile) * acc_esz);
  conv_buf.resize(static_cast<size_t>(tile) * 4);
  for (int64_t t = 0; t < n; t += tile) {
    int64_t m = std::min(tile, n - t);
    auto src_at = [&](size_t r) { return static_cast<const char*>(srcs[r]) + (src_off + t) * static_cast<int64_t>(esz); };
    if (dtype == DType::bf16) {
      float* acc = reinterpret_cast<float*>(acc_buf.data());
      float* tmp = reinterpret_cast<float*>(conv_buf.data());
      const auto* s0 = reinterpret_cast<const BFloat16*>(src_at(0));
      for (int64_t i = 0; i < m; ++i) acc[i] = static_cast<float>(s0[i]);
      for (size_t r = 1; r < srcs.size(); ++r) {
        const auto* sr = reinterpret_cast<const BFloat16*>(src_at(r));
        for (int64_t i = 0; i < m; ++i) tmp[i] = static_cast<float>(sr[i]);
        reduce_into(acc, tmp, m, DType::f32, op);
      }
      for (void* d : dsts) {
        auto* out = reinterpret_cast<BFloat16*>(static_cast<char*>(d) + (dst_off + t) * static_cast<int64_t>(esz));
        for (int64_t i = 0; i < m; ++i) out[i] = BFloat16(acc[i]);
      }
      continue;
    }
    std::memcpy(acc_buf.data(), src_at(0), static_cast<size_t>(m) * esz);
    for (size_t r = 1; r < srcs.size(); ++r) reduce_into(acc_buf.data(), src_at(r), m, acc_type, op);
    for (void* d : dsts)
      std::memcpy(static_cast<char*>(d) + (dst_off + t) * static_cast<int64_t>(esz), acc_buf.data(), static_cast<size_t>(m) * esz);
  }
}

void finish_avg(void* buf, int64_t n, DType dtype, int ranks) {
  TESSEL_DISPATCH_ALL(dtype, "avg", [&]<typename T>() {
    if constexpr (std::is_same_v<T, bool>) {
      TESSEL_THROW("avg: cannot average bool values");
    } else {
      T* p = static_cast<T*>(buf);
      for (int64_t i = 0; i < n; ++i) {
        if constexpr (std::is_same_v<T, BFloat16>) p[i] = BFloat16(static_cast<float>(p[i]) / static_cast<float>(ranks));
        else p[i] = static_cast<T>(p[i] / static_cast<T>(ranks));
      }
    }
  });
}

}  // namespace tessel
