// Attribute lookup and printing.
#include "tessel/core/attrs.h"

namespace tessel {

Attrs& Attrs::set(std::string key, AttrValue value) {
  for (auto& [k, v] : items_)
    if (k == key) {
      v = std::move(value);
      return *this;
    }
  items_.emplace_back(std::move(key), std::move(value));
  return *this;
}

const AttrValue* Attrs::find(std::string_view key) const {
  for (const auto& [k, v] : items_)
    if (k == key) return &v;
  return nullptr;
}

double Attrs::f(std::string_view key) const {
  const AttrValue* v = find(key);
  if (v != nullptr)
    if (const int64_t* i = std::get_if<int64_t>(v)) return static_cast<double>(*i);
  return get<double>(key);
}

std::string Attrs::str() const {
  std::string out;
  for (const auto& [k, v] : items_) {
    if (!out.empty()) out += ", ";
    out += k;
    out += '=';
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::vector<int64_t>>) out += fmt::format("[{}]", fmt::join(x, ","));
          else if constexpr (std::is_same_v<T, bool>) out += x ? "true" : "false";
          else out += fmt::format("{}", x);
        },
        v);
  }
  return out;
}

}  // namespace tessel
