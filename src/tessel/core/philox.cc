// Philox4x32-10 and the layout-independent fills built on it.
#include "tessel/core/philox.h"

#include <cmath>

#include "tessel/core/thread_pool.h"

namespace tessel {

namespace {
constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

PhiloxBlock philox4x32_10(PhiloxBlock c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kM0, c[0], hi0, lo0);
    mulhilo(kM1, c[2], hi1, lo1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

PhiloxBlock philox_at(uint64_t seed, uint64_t stream, uint64_t index) {
  return philox4x32_10({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                        static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)},
                       {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
}

uint64_t stream_key(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return splitmix64(h);
}

uint64_t stream_combine(uint64_t stream, uint64_t value) { return splitmix64(stream ^ splitmix64(value + 1)); }

namespace {
inline float to_unit_f32(uint32_t w) { return static_cast<float>(w >> 8) * (1.0f / 16777216.0f); }
inline double to_unit_f64(uint32_t a, uint32_t b) {
  uint64_t bits = (static_cast<uint64_t>(a) << 21) ^ (static_cast<uint64_t>(b) >> 11);
  return static_cast<double>(bits & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}
inline double normal_from(const PhiloxBlock& r) {
  double u1 = 1.0 - to_unit_f64(r[0], r[1]);  // (0, 1]
  double u2 = to_unit_f64(r[2], r[3]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}
}  // namespace

float uniform_f32_at(uint64_t seed, uint64_t stream, uint64_t index) {
  return to_unit_f32(philox_at(seed, stream, index)[0]);
}
double uniform_f64_at(uint64_t seed, uint64_t stream, uint64_t index) {
  PhiloxBlock r = philox_at(seed, stream, index);
  return to_unit_f64(r[0], r[1]);
}
double normal_at(uint64_t seed, uint64_t stream, uint64_t index) { return normal_from(philox_at(seed, stream, index)); }

void for_each_global_row(const Shape& local_shape, const GlobalBox& box,
                         const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  const size_t nd = local_shape.size();
  const Shape& gshape = box.global_shape.empty() ? local_shape : box.global_shape;
  TESSEL_CHECK(gshape.size() == nd && (box.offset.empty() || box.offset.size() == nd),
               "rng fill: local shape {} does not fit global shape {} with offset {}", shape_str(local_shape),
               shape_str(gshape), shape_str(box.offset));
  for (size_t d = 0; d < nd; ++d) {
    int64_t off = box.offset.empty() ? 0 : box.offset[d];
    TESSEL_CHECK(off >= 0 && off + local_shape[d] <= gshape[d],
                 "rng fill: local block {} at offset {} exceeds global shape {} in dim {}", shape_str(local_shape),
                 shape_str(box.offset), shape_str(gshape), d);
  }
  int64_t n = shape_numel(local_shape);
  if (n == 0) return;
  int64_t row = nd == 0 ? 1 : local_shape[nd - 1];
  int64_t rows = n / row;
  Shape gstrides = contiguous_strides(gshape);
  int64_t grain = std::max<int64_t>(1, 4096 / row);
  parallel_for(0, rows, grain, [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      int64_t rem = r, global = 0;
      for (size_t d = nd; d-- > 0;) {
        int64_t idx = d + 1 == nd ? 0 : rem % local_shape[d];
        if (d + 1 != nd) rem /= local_shape[d];
        int64_t off = box.offset.empty() ? 0 : box.offset[d];
        global += (idx + off) * gstrides[d];
      }
      fn(r * row, global, row);
    }
  });
}

void rng_fill(const Tensor& t, Distribution dist, double a, double b, uint64_t seed, uint64_t stream,
              const GlobalBox& box) {
  TESSEL_CHECK(is_floating(t.dtype()), "rng fill: tensor '{}' has dtype {}; expected a floating dtype", t.name(),
               t.dtype());
  TESSEL_CHECK(t.is_contiguous(), "rng fill: tensor '{}' must be contiguous", t.name());
  if (t.is_meta()) return;  // tracing: a shape to fill, no data
  TESSEL_DISPATCH_ALL(t.dtype(), "rng_fill", [&]<typename T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, BFloat16>) {
      T* p = static_cast<T*>(t.raw_data());
      for_each_global_row(t.shape(), box, [&](int64_t lb, int64_t gb, int64_t len) {
        for (int64_t i = 0; i < len; ++i) {
          PhiloxBlock r = philox_at(seed, stream, static_cast<uint64_t>(gb + i));
          double v = dist == Distribution::uniform ? a + (b - a) * to_unit_f64(r[0], r[1]) : a + b * normal_from(r);
          if constexpr (std::is_same_v<T, BFloat16>) p[lb + i] = BFloat16(static_cast<float>(v));
          else p[lb + i] = static_cast<T>(v);
        }
      });
    }
  });
}

}  // namespace tessel
