// Branch-free f32 exp/tanh that the compiler vectorises (libm's are scalar calls). Relative
// error is about 2e-7, the order of f32 rounding. f64 keeps libm: it is the reference dtype
// of gradient checks.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

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
