// Ctrl-C (SIGINT) and SIGTERM as a request to stop at the next safe point — the end of a
// training step — rather than at once, so that a run writing checkpoints can save where it
// is before it exits. A second signal stops the process at once, as if no handler were
// installed.
#pragma once

#include <string>

namespace tessel {

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

// "SIGINT", "SIGTERM" or the number.
std::string stop_signal_name(int sig);

}  // namespace tessel
