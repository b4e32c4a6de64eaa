// Process signals for the launcher and the trainer: their names, a write that survives a
// closed or full pipe (async-signal-safe), and Ctrl-C (SIGINT) or SIGTERM as a request to stop
// at the next safe point — the end of a training step — rather than at once, so that a run
// writing checkpoints can save where it is before it exits.
#pragma once

#include <string>
#include <string_view>

namespace tessel {

// "SIGINT", "SIGTERM" or the number.
std::string signal_name(int sig);

// Writes all of `s` to fd, retrying after EINTR and waiting out a full pipe; a closed one
// (EPIPE) drops the output. Async-signal-safe.
void write_all(int fd, std::string_view s);

// While one exists, SIGINT and SIGTERM are recorded instead of ending the process; a second
// signal stops the process at once, as if no handler were installed.
class StopSignals {
 public:
  // Installs the handlers; `note` is printed to stderr when the first signal arrives (after
  // the signal's name). One instance at a time.
  explicit StopSignals(const std::string& note);
  ~StopSignals();  // restores the handlers that were there before
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received since construction, 0 if none.
  int requested() const;
};

}  // namespace tessel
