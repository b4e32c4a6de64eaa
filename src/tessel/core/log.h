// Logging to stderr with a level threshold (TESSEL_LOG=debug|info|warn|error, default info)
// and a "[rank R]" prefix when the calling rank is one of several.
#pragma once

#include <string_view>

#include <fmt/format.h>

namespace tessel {

enum class LogLevel { debug, info, warn, error };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_write(LogLevel level, std::string_view message);

template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::debug) log_write(LogLevel::debug, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::info) log_write(LogLevel::info, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::warn) log_write(LogLevel::warn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
  log_write(LogLevel::error, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace tessel
