// Names and sizes of the element types.
#include "tessel/core/dtype.h"

#include "tessel/core/error.h"

namespace tessel {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::b8: return 1;
  }
  TESSEL_ASSERT(false, "bad dtype {}", static_cast<int>(t));
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::b8: return "bool";
  }
  return "?";
}

DType parse_dtype(std::string_view text) {
  struct Alias { std::string_view name; DType type; };
  static constexpr Alias kAliases[] = {
      {"f32", DType::f32},   {"float32", DType::f32}, {"float", DType::f32},
      {"f64", DType::f64},   {"float64", DType::f64}, {"double", DType::f64},
      {"bf16", DType::bf16}, {"bfloat16", DType::bf16},
      {"i32", DType::i32},   {"int32", DType::i32},
      {"i64", DType::i64},   {"int64", DType::i64},
      {"bool", DType::b8},   {"b8", DType::b8},
  };
  for (const Alias& a : kAliases)
    if (a.name == text) return a.type;
  TESSEL_THROW("unknown dtype '{}' (expected one of f32, f64, bf16, i32, i64, bool)", text);
}

}  // namespace tessel

