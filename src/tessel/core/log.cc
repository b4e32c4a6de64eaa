// The logger: one line per call, written whole so lines of concurrent ranks do not interleave.
#include "tessel/core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "tessel/core/context.h"

namespace tessel {

namespace {
LogLevel level_from_env() {
  const char* v = std::getenv("TESSEL_LOG");
  if (v == nullptr) return LogLevel::info;
  if (std::strcmp(v, "debug") == 0) return LogLevel::debug;
  if (std::strcmp(v, "warn") == 0) return LogLevel::warn;
  if (std::strcmp(v, "error") == 0) return LogLevel::error;
  return LogLevel::info;
}
std::atomic<LogLevel>& level_slot() {
  static std::atomic<LogLevel> level{level_from_env()};
  return level;
}
}  // namespace

LogLevel log_level() { return level_slot().load(std::memory_order_relaxed); }
void set_log_level(LogLevel level) { level_slot().store(level); }

void log_write(LogLevel level, std::string_view message) {
  static std::mutex mutex;
  static constexpr const char* kNames[] = {"debug", "info", "warn", "error"};
  const RankContext& c = rank_context();
  // `tessel launch` prefixes each process's lines with its rank already (and sets LOCAL_RANK).
  static const bool launched = std::getenv("LOCAL_RANK") != nullptr;
  std::string line = c.world_size > 1 && !launched ? fmt::format("[rank {}] {}: {}\n", c.rank, kNames[static_cast<int>(level)], message)
                                      : fmt::format("{}: {}\n", kNames[static_cast<int>(level)], message);
  std::lock_guard lock(mutex);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace tessel
