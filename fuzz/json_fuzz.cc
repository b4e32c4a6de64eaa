// Json::parse on arbitrary bytes: a value or tessel::Error, never a crash, a hang or a
// sanitizer report; and the compact text of a value it accepted parses again to the same text.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tessel/core/error.h"
#include "tessel/core/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  tessel::Json value;
  try {
    value = tessel::Json::parse(text);
  } catch (const tessel::Error&) {
    return 0;
  }
  const std::string once = value.dump();
  std::string twice;
  try {
    twice = tessel::Json::parse(once).dump();
  } catch (const tessel::Error& e) {
    std::fprintf(stderr, "dump() wrote text that parse() refuses: %s\n%s\n", e.what(), once.c_str());
    std::abort();
  }
  if (once != twice) {
    std::fprintf(stderr, "dump() is not a fixed point:\n%s\n%s\n", once.c_str(), twice.c_str());
    std::abort();
  }
  return 0;
}
