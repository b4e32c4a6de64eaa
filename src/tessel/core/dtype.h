// Element types. Floating types f32 and f64 compute natively; bf16 is a storage format
// (kernels convert to f32, compute, and round back). i32/i64 hold indices, bool masks.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

namespace tessel {

enum class DType : uint8_t { f32, f64, bf16, i32, i64, b8 };
inline constexpr int kNumDTypes = 6;
inline constexpr DType kAllDTypes[kNumDTypes] = {DType::f32, DType::f64, DType::bf16,
                                                 DType::i32, DType::i64, DType::b8};

// bfloat16: the upper half of an IEEE f32. Conversion from f32 rounds to nearest even.
struct BFloat16 {
  uint16_t bits = 0;

  BFloat16() = default;
  explicit BFloat16(float f) : bits(round_from(f)) {}
  explicit operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  static uint16_t round_from(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>((u + rounding) >> 16);
  }
};
static_assert(sizeof(BFloat16) == 2);

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
// Parses "f32", "float32", "f64", "float64", "bf16", "bfloat16", "i32", "int32", "i64",
// "int64", "bool". Throws Error naming the text otherwise.
DType parse_dtype(std::string_view text);
inline bool is_floating(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::bf16; }
inline bool is_integral(DType t) { return t == DType::i32 || t == DType::i64; }

template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::f32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::f64; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::bf16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::i32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::i64; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::b8; };
template <typename T> inline constexpr DType dtype_of = DTypeOf<T>::value;

}  // namespace tessel

template <>
struct fmt::formatter<tessel::DType> : fmt::formatter<std::string_view> {
  auto format(tessel::DType t, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(tessel::dtype_name(t), ctx);
  }
};

// TESSEL_DISPATCH_FLOAT(dtype, "op", [&]<typename T>() {...}): calls the lambda with T =
// float or double; throws naming the op for any other dtype. bf16 is handled by callers
// (converted to f32 first).
#define TESSEL_DISPATCH_FLOAT(dtype, opname, ...)                                            \
  [&] {                                                                                      \
    switch (dtype) {                                                                         \
      case ::tessel::DType::f32: return (__VA_ARGS__).template operator()<float>();          \
      case ::tessel::DType::f64: return (__VA_ARGS__).template operator()<double>();         \
      default:                                                                               \
        TESSEL_THROW("{}: unsupported dtype {} (expected f32 or f64)", opname, dtype);       \
    }                                                                                        \
  }()

// TESSEL_DISPATCH_ALL(dtype, "op", lambda): T ranges over every dtype's C++ type.
#define TESSEL_DISPATCH_ALL(dtype, opname, ...)                                              \
  [&] {                                                                                      \
    switch (dtype) {                                                                         \
      case ::tessel::DType::f32: return (__VA_ARGS__).template operator()<float>();          \
      case ::tessel::DType::f64: return (__VA_ARGS__).template operator()<double>();         \
      case ::tessel::DType::bf16: return (__VA_ARGS__).template operator()<::tessel::BFloat16>(); \
      case ::tessel::DType::i32: return (__VA_ARGS__).template operator()<int32_t>();        \
      case ::tessel::DType::i64: return (__VA_ARGS__).template operator()<int64_t>();        \
      case ::tessel::DType::b8: return (__VA_ARGS__).template operator()<bool>();            \
    }                                                                                        \
    TESSEL_THROW("{}: invalid dtype", opname);                                               \
  }()

// TESSEL_DISPATCH_INDEX(dtype, "op", lambda): T = int32_t or int64_t.
#define TESSEL_DISPATCH_INDEX(dtype, opname, ...)                                            \
  [&] {                                                                                      \
    switch (dtype) {                                                                         \
      case ::tessel::DType::i32: return (__VA_ARGS__).template operator()<int32_t>();        \
      case ::tessel::DType::i64: return (__VA_ARGS__).template operator()<int64_t>();        \
      default:                                                                               \
        TESSEL_THROW("{}: index tensor must be i32 or i64, got {}", opname, dtype);          \
    }                                                                                        \
  }()
