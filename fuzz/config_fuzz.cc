// parse_run_config on arbitrary text: the input up to its first NUL byte is the YAML, each
// NUL-separated piece after it one `--set key=value` override. Relative paths resolve in an
// empty scratch folder. A RunConfig or a tessel::Error naming the key, never a crash, a hang
// or a sanitizer report.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "tessel/cli/config.h"
#include "tessel/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const size_t nul = text.find('\0');
  const std::string yaml = text.substr(0, nul);
  std::vector<std::string> overrides;
  for (size_t at = nul; at != std::string::npos && at < text.size();) {
    const size_t next = text.find('\0', at + 1);
    overrides.push_back(text.substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1));
    at = next;
  }
  try {
    tessel::parse_run_config(yaml, overrides, tessel::fuzz::scratch_dir(), "fuzz.yaml");
  } catch (const tessel::Error&) {
  }
  return 0;
}
