// Placement text forms.
#include "tessel/sharding/placement.h"

#include <cctype>
#include <charconv>

#include "tessel/core/error.h"

namespace tessel {

std::string Placement::str() const {
  switch (kind) {
    case Kind::replicate: return "R";
    case Kind::shard: return fmt::format("S({})", dim);
    case Kind::partial: return fmt::format("P({})", reduce);
  }
  return "?";
}

namespace {
std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}
}  // namespace

Placement parse_placement(std::string_view text) {
  std::string_view t = trim(text);
  if (t == "R") return Replicate();
  if (t == "P") return Partial();
  if (t.size() >= 4 && (t[0] == 'S' || t[0] == 'P') && t[1] == '(' && t.back() == ')') {
    std::string_view inner = trim(t.substr(2, t.size() - 3));
    if (t[0] == 'P') return Partial(parse_reduce_op(inner));
    int64_t d = 0;
    auto [ptr, ec] = std::from_chars(inner.data(), inner.data() + inner.size(), d);
    if (ec == std::errc() && ptr == inner.data() + inner.size() && d >= 0) return Shard(d);
  }
  TESSEL_THROW("bad placement '{}' (expected S(<dim>), R or P(sum|avg|max|min))", text);
}

std::string placements_str(const Placements& p) {
  std::string out = "[";
  for (size_t i = 0; i < p.size(); ++i) {
    if (i > 0) out += ',';
    out += p[i].str();
  }
  return out + "]";
}

Placements parse_placements(std::string_view text) {
  std::string_view t = trim(text);
  if (!t.empty() && t.front() == '[') {
    TESSEL_CHECK(t.back() == ']', "bad placement list '{}': missing ']'", text);
    t = t.substr(1, t.size() - 2);
  }
  Placements out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= t.size(); ++i) {
    if (i < t.size() && t[i] == '(') ++depth;
    if (i < t.size() && t[i] == ')') --depth;
    if (i == t.size() || (t[i] == ',' && depth == 0)) {
      std::string_view item = trim(t.substr(start, i - start));
      if (!item.empty() || i < t.size()) out.push_back(parse_placement(item));
      start = i + 1;
    }
  }
  return out;
}

}  // namespace tessel
