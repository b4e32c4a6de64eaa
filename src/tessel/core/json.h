// A small JSON value with a strict, bounds-checked parser and a writer. Used for the
// safetensors header, JSONL metrics, Chrome traces and machine-readable CLI output. Numbers
// keep their integer form when they have one, so 64-bit offsets survive a round trip.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace tessel {

class Json {
 public:
  using Array = std::vector<Json>;
  using Object = std::map<std::string, Json>;

  Json() = default;  // null
  Json(std::nullptr_t) {}
  Json(bool b) : v_(b) {}
  Json(int v) : v_(static_cast<int64_t>(v)) {}
  Json(int64_t v) : v_(v) {}
  Json(uint64_t v) : v_(static_cast<int64_t>(v)) {}
  Json(double v) : v_(v) {}
  Json(const char* s) : v_(std::string(s)) {}
  Json(std::string s) : v_(std::move(s)) {}
  Json(std::string_view s) : v_(std::string(s)) {}
  Json(Array a) : v_(std::make_shared<Array>(std::move(a))) {}
  Json(Object o) : v_(std::make_shared<Object>(std::move(o))) {}

  // Parses one JSON document (trailing whitespace allowed); throws Error naming the offset
  // and what was expected. Nesting deeper than 256 levels is rejected.
  static Json parse(std::string_view text);

  bool is_null() const { return v_.index() == 0; }
  bool is_bool() const { return v_.index() == 1; }
  bool is_int() const { return v_.index() == 2; }
  bool is_number() const { return v_.index() == 2 || v_.index() == 3; }
  bool is_string() const { return v_.index() == 4; }
  bool is_array() const { return v_.index() == 5; }
  bool is_object() const { return v_.index() == 6; }

  // Typed access; throws Error when the value has another type.
  bool as_bool() const;
  int64_t as_int() const;
  double as_double() const;
  const std::string& as_string() const;
  const Array& as_array() const;
  const Object& as_object() const;
  Array& array();    // converts null to an empty array
  Object& object();  // converts null to an empty object

  // Object member access; `at` throws naming the key when absent.
  const Json& at(std::string_view key) const;
  const Json* find(std::string_view key) const;
  Json& operator[](const std::string& key) { return object()[key]; }
  void push_back(Json v) { array().push_back(std::move(v)); }

  // Compact single-line text (object keys sorted).
  std::string dump() const;

 private:
  std::variant<std::monostate, bool, int64_t, double, std::string, std::shared_ptr<Array>, std::shared_ptr<Object>> v_;
};

// `s` as a quoted JSON string with escapes.
std::string json_quote(std::string_view s);

}  // namespace tessel
