// Branch-free f32 exp/tanh that the compiler vectorises (libm's are scalar calls). Relative
// error is about 2e-7, the order of f32 rounding. f64 keeps libm: it is the reference dtype
// of gradient checks.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace tessel::fast {

// e^x: x = n·ln2 + r with |r| <= ln2/2, e^r by its degree-7 Taylor polynomial (error
// below 1e-8), 2^n from the exponent bits. Results below 2.6e-38 flush to 0; above the f32
// range give +inf.
inline float exp(float x) {
  const float kLog2e = 1.44269504088896341f;
  const float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  float xc = x < -86.5f ? -86.5f : (x > 88.7f ? 88.7f : x);
  float t = xc * kLog2e + 12582912.0f;  // rounds to an integer: 1.5·2^23 leaves no fraction bits
  float n = t - 12582912.0f;
  int32_t ni;
  std::memcpy(&ni, &t, sizeof ni);
  ni -= 0x4B400000;  // the bits of 1.5·2^23; what remains is n
  float r = xc - n * kLn2Hi - n * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t bits = (ni + 126) << 23;  // 2^(n-1), then ×2: keeps n = 128 representable
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  float y = (p * scale) * 2.0f;
  y = x < -86.5f ? 0.0f : y;
  y = x > 88.72f ? INFINITY : y;
  return y;
}

#if defined(__AVX512F__)
// e^x on 16 lanes: the reduction and polynomial of exp() above, with its clamps and the
// exponent's bit arithmetic left to vscalefps (2^n exactly; 0 below the range, -inf
// included; +inf above it; NaN stays NaN): about 12 instructions where exp() vectorised by
// the compiler takes about 20 (attention's score tiles). Relative error below 1e-7.
inline __m512 exp16(__m512 x) {
  // max/min return their second operand when one is NaN: x second keeps a NaN. (The
  // all-lanes mask forms: GCC 12's unmasked ones warn of an uninitialised placeholder.)
  const __mmask16 all = 0xFFFF;
  const __m512 lo = _mm512_set1_ps(-110.0f), hi = _mm512_set1_ps(88.8f);
  const __m512 xc = _mm512_mask_min_ps(hi, all, hi, _mm512_mask_max_ps(lo, all, lo, x));
  const __m512 n = _mm512_mask_roundscale_ps(xc, all, _mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_mask_scalef_ps(p, all, p, n);
}

// 2^x on 16 lanes of finite x, for attention, which folds log2(e) into its scores' scale so
// that each exponential saves exp16's multiply and two-step reduction. With AVX-512DQ: x = n +
// r with n = floor(x) and r in [0, 1) taken exactly in one instruction (vreduceps), 2^r by a
// degree-6 minimax polynomial on [0, 1) (relative error 2e-9 before the f32 roundings; fitted
// by scripts/fit_exp2_poly.py, a Remez exchange), and 2^n by vscalefps, which takes the floor
// of x itself — 8 vector µops where the form below takes 10 (a fully visible block pair's port
// cycles are what bounds the attention kernel). Otherwise n = round(x), r = x - n with
// |r| <= 1/2, 2^r by Cephes exp2f's degree-6 polynomial. Either way the relative error is below
// 2e-7, and 2^n is exact for any n (0 below the range, +inf above it). ±inf give NaN: exp2_16
// below clamps them first.
// c[0] + c[1]·r + … + c[6]·r^6 by Horner's rule, from the highest power down.
inline __m512 poly6_16(__m512 r, const float (&c)[7]) {
  __m512 p = _mm512_set1_ps(c[6]);
  for (int k = 5; k >= 0; --k) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c[k]));
  return p;
}

inline __m512 exp2_16_finite(__m512 x) {
  const __mmask16 all = 0xFFFF;
#if defined(__AVX512DQ__)
  constexpr float kOnUnit[7] = {1.0f,
                                6.931470036506653e-1f,
                                2.402298301458359e-1f,
                                5.548334121704102e-2f,
                                9.678840637207031e-3f,
                                1.243968727067113e-3f,
                                2.170225488953292e-4f};
  const __m512 r = _mm512_mask_reduce_ps(x, all, x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 p = poly6_16(r, kOnUnit);
  return _mm512_mask_scalef_ps(p, all, p, x);
#else
  constexpr float kCephes[7] = {1.0f,
                                6.931472028550421e-1f,
                                2.402264791363012e-1f,
                                5.550332471162809e-2f,
                                9.618437357674640e-3f,
                                1.339887440266574e-3f,
                                1.535336188319500e-4f};
  const __m512 n = _mm512_mask_roundscale_ps(x, all, x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 p = poly6_16(_mm512_sub_ps(x, n), kCephes);
  return _mm512_mask_scalef_ps(p, all, p, n);
#endif
}

// 2^x on 16 lanes: exp2_16_finite with x clamped to [-160, 129] first, so -inf gives 0, +inf
// gives +inf, and NaN stays NaN (max/min return their second operand, x, when one is NaN).
inline __m512 exp2_16(__m512 x) {
  const __mmask16 all = 0xFFFF;
  const __m512 lo = _mm512_set1_ps(-160.0f), hi = _mm512_set1_ps(129.0f);
  return exp2_16_finite(_mm512_mask_min_ps(hi, all, hi, _mm512_mask_max_ps(lo, all, lo, x)));
}
#endif

// 2^x for the non-AVX-512 paths of the same kernels: e^(x·ln2) by fast::exp.
inline float exp2(float x) { return fast::exp(x * 0.693147180559945309f); }

// tanh: odd-symmetric 1 - 2/(e^{2|x|}+1), with a Taylor series near 0 to keep relative accuracy.
inline float tanh(float x) {
  float ax = x < 0 ? -x : x;
  float e = fast::exp(2.0f * ax);
  float big = 1.0f - 2.0f / (e + 1.0f);
  float x2 = ax * ax;
  float small = ax * (1.0f + x2 * (-1.0f / 3.0f + x2 * (2.0f / 15.0f + x2 * (-17.0f / 315.0f))));
  float y = ax < 0.125f ? small : big;
  return x < 0 ? -y : y;
}

inline float sigmoid(float x) { return 1.0f / (1.0f + fast::exp(-x)); }

// Type-generic forms used by kernels templated on float/double.
template <typename T>
inline T exp_t(T x) {
  if constexpr (sizeof(T) == 4) return fast::exp(x);
  else return std::exp(x);
}
template <typename T>
inline T tanh_t(T x) {
  if constexpr (sizeof(T) == 4) return fast::tanh(x);
  else return std::tanh(x);
}
template <typename T>
inline T sigmoid_t(T x) {
  return T(1) / (T(1) + exp_t<T>(-x));
}

}  // namespace tessel::fast
