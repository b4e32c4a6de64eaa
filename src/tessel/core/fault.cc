// TESSEL_FAULT: injected crashes, hangs and exits.
#include "tessel/core/fault.h"

#include <signal.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>

#include "tessel/core/error.h"

namespace tessel {

FaultSpec parse_fault(const std::string& text) {
  FaultSpec f;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(at, end - at);
    at = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    TESSEL_CHECK(eq != std::string::npos, "TESSEL_FAULT: '{}' is not key=value", item);
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    auto number = [&](int64_t& out) {
      auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
      TESSEL_CHECK(ec == std::errc() && p == value.data() + value.size() && out >= 0,
                      "TESSEL_FAULT: {} must be a whole number, 0 or more, got '{}'", key, value);
    };
    if (key == "rank") number(f.rank);
    else if (key == "step") number(f.step);
    else if (key == "after_bytes") number(f.after_bytes);
    else if (key == "action") f.action = value;
    else if (key == "during") f.during = value;
    else TESSEL_THROW("TESSEL_FAULT: unknown key '{}' (known: rank, step, action, during, after_bytes)", key);
  }
  TESSEL_CHECK(f.action == "crash" || f.action == "hang" || f.action == "exit" || f.action == "error",
                  "TESSEL_FAULT: action must be crash, hang, exit or error, got '{}'", f.action);
  TESSEL_CHECK(f.during == "step" || f.during == "save",
                  "TESSEL_FAULT: during must be step or save, got '{}'", f.during);
  return f;
}

std::optional<FaultSpec> armed_fault(const char* during, int64_t rank, int64_t step) {
  const char* env = std::getenv("TESSEL_FAULT");
  if (env == nullptr || *env == '\0') return std::nullopt;
  const FaultSpec f = parse_fault(env);
  if (f.during != during || (f.rank >= 0 && f.rank != rank) || (f.step >= 0 && f.step != step)) return std::nullopt;
  return f;
}

void inject_fault(const FaultSpec& f) {
  std::fprintf(stderr, "TESSEL_FAULT: rank %lld %s (%s %lld)\n", static_cast<long long>(f.rank), f.action.c_str(),
               f.during.c_str(), static_cast<long long>(f.step));
  std::fflush(stderr);
  if (f.action == "crash") ::kill(::getpid(), SIGKILL);
  if (f.action == "hang") {
    ::kill(::getpid(), SIGSTOP);
    return;
  }
  if (f.action == "error")  // a write that fails as a full or broken disk makes it fail
    throw CheckpointWriteError(fmt::format("TESSEL_FAULT: rank {} injected a write error ({} {})", f.rank, f.during,
                                           f.step));
  ::_exit(3);
}

}  // namespace tessel
