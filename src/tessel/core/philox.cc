// Philox4x32-10 and the layout-independent fills built on it.
#include "tessel/core/philox.h"


#include <algorithm>
#include <cmath>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "tessel/core/thread_pool.h"
#include "tessel/core/view.h"

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

void philox_blocks(uint64_t seed, uint64_t stream, uint64_t first, int64_t n, uint32_t* words) {
  int64_t at = 0;
#if defined(__AVX512F__)
  // 16 counters at a time, one per 32-bit lane: a round's two 32 x 32 -> 64-bit products are
  // vpmuludq on the even lanes and on the odd lanes shifted down, their halves blended back.
  const __m512i m0 = _mm512_set1_epi64(kM0), m1 = _mm512_set1_epi64(kM1);
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  constexpr __mmask16 kOdd = 0xAAAA;
  for (; at + 16 <= n; at += 16) {
    const uint64_t base = first + static_cast<uint64_t>(at);
    // Low words base + lane; the high word carries where the low one wraps.
    const __m512i lo = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(base))), lanes);
    const __mmask16 wrapped =
        _mm512_cmplt_epu32_mask(lo, _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(base))));
    __m512i c0 = lo;
    __m512i c1 = _mm512_mask_add_epi32(_mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(base >> 32))), wrapped,
                                       _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(base >> 32))),
                                       _mm512_set1_epi32(1));
    __m512i c2 = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(stream)));
    __m512i c3 = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(stream >> 32)));
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {
      const __m512i p0e = _mm512_mul_epu32(c0, m0), p0o = _mm512_mul_epu32(_mm512_srli_epi64(c0, 32), m0);
      const __m512i p1e = _mm512_mul_epu32(c2, m1), p1o = _mm512_mul_epu32(_mm512_srli_epi64(c2, 32), m1);
      const __m512i lo0 = _mm512_mask_blend_epi32(kOdd, p0e, _mm512_slli_epi64(p0o, 32));
      const __m512i hi0 = _mm512_mask_blend_epi32(kOdd, _mm512_srli_epi64(p0e, 32), p0o);
      const __m512i lo1 = _mm512_mask_blend_epi32(kOdd, p1e, _mm512_slli_epi64(p1o, 32));
      const __m512i hi1 = _mm512_mask_blend_epi32(kOdd, _mm512_srli_epi64(p1e, 32), p1o);
      c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32(static_cast<int>(k0)));
      c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32(static_cast<int>(k1)));
      c1 = lo1;
      c3 = lo0;
      k0 += kW0;
      k1 += kW1;
    }
    // Interleave the four word vectors into 16 blocks of 4 words.
    const __m512i a = _mm512_unpacklo_epi32(c0, c1), b = _mm512_unpackhi_epi32(c0, c1);
    const __m512i c = _mm512_unpacklo_epi32(c2, c3), d = _mm512_unpackhi_epi32(c2, c3);
    const __m512i w0 = _mm512_unpacklo_epi64(a, c), w1 = _mm512_unpackhi_epi64(a, c);
    const __m512i w2 = _mm512_unpacklo_epi64(b, d), w3 = _mm512_unpackhi_epi64(b, d);
    // w0..w3 hold, per 128-bit lane l, blocks 4l, 4l+1, 4l+2, 4l+3.
    alignas(64) uint32_t out[4][16];
    _mm512_store_si512(out[0], w0);
    _mm512_store_si512(out[1], w1);
    _mm512_store_si512(out[2], w2);
    _mm512_store_si512(out[3], w3);
    uint32_t* dst = words + 4 * at;
    for (int l = 0; l < 4; ++l)
      for (int j = 0; j < 4; ++j) std::copy_n(&out[j][4 * l], 4, dst + 4 * (4 * l + j));
  }
#endif
  for (; at < n; ++at) {
    const PhiloxBlock b = philox_at(seed, stream, first + static_cast<uint64_t>(at));
    std::copy(b.begin(), b.end(), words + 4 * at);
  }
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

namespace {

// The CPU's fill of contiguous host-readable `t`.
void rng_fill_host(const Tensor& t, Distribution dist, double a, double b, uint64_t seed, uint64_t stream,
                   const GlobalBox& box) {
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


}  // namespace

void rng_fill(const Tensor& t, Distribution dist, double a, double b, uint64_t seed, uint64_t stream,
              const GlobalBox& box) {
  TESSEL_CHECK(is_floating(t.dtype()), "rng fill: tensor '{}' has dtype {}; expected a floating dtype", t.name(),
               t.dtype());
  TESSEL_CHECK(t.is_contiguous(), "rng fill: tensor '{}' must be contiguous", t.name());
  if (t.is_meta()) return;  // tracing: a shape to fill, no data
  const Device d = t.device();
  if (d.is_cpu()) return rng_fill_host(t, dist, a, b, seed, stream, box);
  if (device_backend(d).runs_cpu_kernels()) {
    KernelScope scope(d);
    return rng_fill_host(t, dist, a, b, seed, stream, box);
  }
  // A device without a generator of its own: the same values made on the host, copied there.
  Tensor host = Tensor::empty(t.shape(), t.dtype(), Device{});
  rng_fill_host(host, dist, a, b, seed, stream, box);
  view::copy(t, host);
}

}  // namespace tessel
