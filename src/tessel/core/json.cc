// JSON parsing and writing.
#include "tessel/core/json.h"

#include <charconv>
#include <cmath>

#include "tessel/core/error.h"

namespace tessel {

namespace {

class Parser {
 public:
  explicit Parser(std::string_view t) : t_(t) {}

  Json document() {
    Json v = value(0);
    skip_ws();
    if (pos_ != t_.size()) fail("end of input");
    return v;
  }

 private:
  [[noreturn]] void fail(std::string_view expected) {
    std::string near;  // printable: other bytes as \xNN
    for (char c : t_.substr(pos_, 20)) {
      const auto b = static_cast<unsigned char>(c);
      near += b >= 0x20 && b < 0x7F ? std::string(1, c) : fmt::format("\\x{:02X}", b);
    }
    TESSEL_THROW("invalid JSON at offset {}: expected {}{}", pos_, expected,
                 pos_ < t_.size() ? fmt::format(" near '{}'", near) : std::string(" but the text ended"));
  }
  void skip_ws() {
    while (pos_ < t_.size() && (t_[pos_] == ' ' || t_[pos_] == '\t' || t_[pos_] == '\n' || t_[pos_] == '\r')) ++pos_;
  }
  bool consume(char c) {
    skip_ws();
    if (pos_ < t_.size() && t_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!consume(c)) fail(fmt::format("'{}'", c));
  }
  bool literal(std::string_view word) {
    if (t_.substr(pos_, word.size()) == word) {
      pos_ += word.size();
      return true;
    }
    return false;
  }

  Json value(int depth) {
    if (depth > 256) fail("less nesting (depth limit 256)");
    skip_ws();
    if (pos_ >= t_.size()) fail("a value");
    char c = t_[pos_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return Json(string());
    if (literal("true")) return Json(true);
    if (literal("false")) return Json(false);
    if (literal("null")) return Json();
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    fail("a value");
  }

  Json object(int depth) {
    ++pos_;
    Json::Object o;
    if (consume('}')) return Json(std::move(o));
    do {
      skip_ws();
      if (pos_ >= t_.size() || t_[pos_] != '"') fail("a string key");
      std::string key = string();
      expect(':');
      if (o.count(key)) TESSEL_THROW("invalid JSON: duplicate key \"{}\" before offset {}", key, pos_);
      o.emplace(std::move(key), value(depth + 1));
    } while (consume(','));
    expect('}');
    return Json(std::move(o));
  }

  Json array(int depth) {
    ++pos_;
    Json::Array a;
    if (consume(']')) return Json(std::move(a));
    do a.push_back(value(depth + 1));
    while (consume(','));
    expect(']');
    return Json(std::move(a));
  }

  Json number() {
    size_t start = pos_;
    if (t_[pos_] == '-') ++pos_;
    if (pos_ + 1 < t_.size() && t_[pos_] == '0' && t_[pos_ + 1] >= '0' && t_[pos_ + 1] <= '9') {
      ++pos_;
      fail("no leading zero in a number");
    }
    bool is_float = false;
    while (pos_ < t_.size()) {
      char c = t_[pos_];
      if (c >= '0' && c <= '9') {
        ++pos_;
      } else if (c == '.' || c == 'e' || c == 'E' || c == '+' || (c == '-' && pos_ > start)) {
        is_float = true;
        ++pos_;
      } else {
        break;
      }
    }
    std::string_view num = t_.substr(start, pos_ - start);
    if (!is_float) {
      int64_t v = 0;
      auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
      if (ec == std::errc() && p == num.data() + num.size()) return Json(v);
    }
    double d = 0;
    auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), d);
    if (ec != std::errc() || p != num.data() + num.size()) {
      pos_ = start;
      fail("a number");
    }
    return Json(d);
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  uint32_t hex4() {
    if (pos_ + 4 > t_.size()) fail("4 hex digits");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = t_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<uint32_t>(c - 'A' + 10);
      else fail("a hex digit");
    }
    return v;
  }

  // One multi-byte UTF-8 character at pos_, copied to `out`: the lead byte's length, its
  // continuation bytes, and no overlong form, surrogate or code point above U+10FFFF.
  void utf8_sequence(std::string& out) {
    const unsigned char lead = static_cast<unsigned char>(t_[pos_]);
    const size_t len = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 0;
    if (len == 0 || lead > 0xF4 || pos_ + len > t_.size()) fail("valid UTF-8");
    uint32_t cp = lead & (0x7F >> len);
    for (size_t i = 1; i < len; ++i) {
      const unsigned char b = static_cast<unsigned char>(t_[pos_ + i]);
      if ((b & 0xC0) != 0x80) fail("valid UTF-8");
      cp = cp << 6 | (b & 0x3F);
    }
    constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) fail("valid UTF-8");
    out.append(t_.substr(pos_, len));
    pos_ += len;
  }

  std::string string() {
    ++pos_;  // opening quote
    std::string out;
    for (;;) {
      if (pos_ >= t_.size()) fail("a closing '\"'");
      char c = t_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) {
        --pos_;
        fail("no raw control character inside a string");
      }
      if (static_cast<unsigned char>(c) >= 0x80) {
        --pos_;
        utf8_sequence(out);
        continue;
      }
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= t_.size()) fail("an escape character");
      char e = t_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xDC00 && cp < 0xE000) {
            pos_ -= 4;
            fail("a high surrogate (\\uD800-\\uDBFF) before this low one");
          }
          if (cp >= 0xD800 && cp < 0xDC00) {
            if (t_.substr(pos_, 2) != "\\u") fail("a low surrogate (\\uDC00-\\uDFFF) after a high one");
            pos_ += 2;
            uint32_t lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) {
              pos_ -= 4;
              fail("a low surrogate (\\uDC00-\\uDFFF) after a high one");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          --pos_;
          fail("a valid escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u)");
      }
    }
  }

  std::string_view t_;
  size_t pos_ = 0;
};

const char* type_name(const Json& j) {
  if (j.is_null()) return "null";
  if (j.is_bool()) return "bool";
  if (j.is_number()) return "number";
  if (j.is_string()) return "string";
  if (j.is_array()) return "array";
  return "object";
}

void dump_to(const Json& j, std::string& out) {
  if (j.is_null()) {
    out += "null";
  } else if (j.is_bool()) {
    out += j.as_bool() ? "true" : "false";
  } else if (j.is_int()) {
    out += std::to_string(j.as_int());
  } else if (j.is_number()) {
    double d = j.as_double();
    if (!std::isfinite(d)) out += "null";
    else if (d == 0 && std::signbit(d)) out += "-0.0";  // "-0" would read back as the integer 0
    else out += fmt::format("{}", d);
  } else if (j.is_string()) {
    out += json_quote(j.as_string());
  } else if (j.is_array()) {
    out += '[';
    bool first = true;
    for (const Json& e : j.as_array()) {
      if (!first) out += ',';
      first = false;
      dump_to(e, out);
    }
    out += ']';
  } else {
    out += '{';
    bool first = true;
    for (const auto& [k, v] : j.as_object()) {
      if (!first) out += ',';
      first = false;
      out += json_quote(k);
      out += ':';
      dump_to(v, out);
    }
    out += '}';
  }
}

}  // namespace

Json Json::parse(std::string_view text) { return Parser(text).document(); }

bool Json::as_bool() const {
  TESSEL_CHECK(is_bool(), "JSON: expected a bool, got {}", type_name(*this));
  return std::get<bool>(v_);
}
int64_t Json::as_int() const {
  if (is_int()) return std::get<int64_t>(v_);
  TESSEL_CHECK(is_number(), "JSON: expected an integer, got {}", type_name(*this));
  double d = std::get<double>(v_);
  TESSEL_CHECK(d == std::floor(d) && std::fabs(d) < 9.2e18, "JSON: expected an integer, got {}", d);
  return static_cast<int64_t>(d);
}
double Json::as_double() const {
  if (is_int()) return static_cast<double>(std::get<int64_t>(v_));
  TESSEL_CHECK(is_number(), "JSON: expected a number, got {}", type_name(*this));
  return std::get<double>(v_);
}
const std::string& Json::as_string() const {
  TESSEL_CHECK(is_string(), "JSON: expected a string, got {}", type_name(*this));
  return std::get<std::string>(v_);
}
const Json::Array& Json::as_array() const {
  TESSEL_CHECK(is_array(), "JSON: expected an array, got {}", type_name(*this));
  return *std::get<std::shared_ptr<Array>>(v_);
}
const Json::Object& Json::as_object() const {
  TESSEL_CHECK(is_object(), "JSON: expected an object, got {}", type_name(*this));
  return *std::get<std::shared_ptr<Object>>(v_);
}
Json::Array& Json::array() {
  if (is_null()) v_ = std::make_shared<Array>();
  TESSEL_CHECK(is_array(), "JSON: expected an array, got {}", type_name(*this));
  return *std::get<std::shared_ptr<Array>>(v_);
}
Json::Object& Json::object() {
  if (is_null()) v_ = std::make_shared<Object>();
  TESSEL_CHECK(is_object(), "JSON: expected an object, got {}", type_name(*this));
  return *std::get<std::shared_ptr<Object>>(v_);
}

const Json* Json::find(std::string_view key) const {
  const Object& o = as_object();
  auto it = o.find(std::string(key));
  return it == o.end() ? nullptr : &it->second;
}

const Json& Json::at(std::string_view key) const {
  const Json* v = find(key);
  TESSEL_CHECK(v != nullptr, "JSON: missing key \"{}\"", key);
  return *v;
}

std::string Json::dump() const {
  std::string out;
  dump_to(*this, out);
  return out;
}

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) out += fmt::format("\\u{:04x}", static_cast<int>(c));
        else out += c;
    }
  }
  return out + "\"";
}

}  // namespace tessel
