// Op attributes: a small ordered list of named values (dims, eps, flags, ...). Generic so the
// op registry, the tracer and the planner can print, compare and carry any op's parameters.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "tessel/core/dtype.h"
#include "tessel/core/error.h"

namespace tessel {

using AttrValue = std::variant<int64_t, double, bool, std::vector<int64_t>, std::string, DType>;

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items) : items_(items) {}

  Attrs& set(std::string key, AttrValue value);
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed access; throws naming the key when missing or of another type. An int attribute
  // reads as double too.
  int64_t i(std::string_view key) const { return get<int64_t>(key); }
  double f(std::string_view key) const;
  bool b(std::string_view key) const { return get<bool>(key); }
  const std::vector<int64_t>& ints(std::string_view key) const { return get<std::vector<int64_t>>(key); }
  const std::string& s(std::string_view key) const { return get<std::string>(key); }
  DType dtype(std::string_view key) const { return get<DType>(key); }

  int64_t i_or(std::string_view key, int64_t fallback) const { return has(key) ? i(key) : fallback; }
  double f_or(std::string_view key, double fallback) const { return has(key) ? f(key) : fallback; }
  bool b_or(std::string_view key, bool fallback) const { return has(key) ? b(key) : fallback; }

  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }
  // "dim=1, keepdim=true"
  std::string str() const;
  bool operator==(const Attrs&) const = default;

 private:
  const AttrValue* find(std::string_view key) const;
  template <typename T>
  const T& get(std::string_view key) const {
    const AttrValue* v = find(key);
    TESSEL_CHECK(v != nullptr, "missing op attribute '{}' (have: {})", key, str());
    const T* p = std::get_if<T>(v);
    TESSEL_CHECK(p != nullptr, "op attribute '{}' has the wrong type (have: {})", key, str());
    return *p;
  }
  std::vector<std::pair<std::string, AttrValue>> items_;
};

}  // namespace tessel
