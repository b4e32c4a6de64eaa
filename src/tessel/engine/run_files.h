// The files a run writes beside its checkpoints: the Chrome-trace/Perfetto timeline (every
// rank's slices, written by rank 0, one row per rank) and the JSONL metrics file, which a
// resumed run trims to the steps before the one it starts from.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace tessel {

// Microseconds from the steady clock's epoch to `t`: a timeline slice's start.
double micros_since_epoch(std::chrono::steady_clock::time_point t);

// One timeline slice.
struct TraceEvent {
  std::string name, category;
  double start_us = 0, dur_us = 0;
};

// Collective over the world group: every rank's events go to rank 0 (as JSON text), which
// writes the Chrome-trace file at `path`, `label` (the layout) recorded with it.
void write_trace(const std::string& path, const std::vector<TraceEvent>& events, const std::string& label);

// Rewrites a JSONL metrics file keeping only the lines of steps before `step` (and lines that
// are not step records), atomically; a missing file is left missing.
void keep_metrics_before(const std::string& path, int64_t step);

}  // namespace tessel
