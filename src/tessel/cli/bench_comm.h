// `tessel bench comm`: collective timings in the style of nccl-tests (size, count, type,
// time, algbw, busbw with nccl-tests' bus-bandwidth factors), beside the machine's memcpy
// bandwidth measured in the same run; on Gloo also beside Gloo's own ring all_reduce, and for
// all_to_all on a group over several nodes the hierarchical form beside the flat one.
#pragma once

#include <cstdint>
#include <string>

#include "tessel/comm/store.h"

namespace tessel {

struct CommBenchOptions {
  std::string backend = "thread";  // thread, gloo (under tessel launch: gloo across processes)
  int np = 2;                      // ranks (thread / in-process gloo); ignored under tessel launch
  std::string op = "all_reduce";   // all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send_recv
  int64_t min_bytes = 1 << 10, max_bytes = 64 << 20;
  int iterations = 0;              // 0: adaptive (at least 0.2 s per size)
  int ranks_per_node = 0;          // > 0: thread / in-process gloo ranks on emulated nodes of this many
};

// Runs the benchmark and prints the table on rank 0; returns the exit status.
int run_comm_bench(const CommBenchOptions& options);

// Bytes copied per second by one thread's memcpy of `bytes` (median of 5 copies).
double measure_memcpy_bandwidth(int64_t bytes = 256 << 20);

}  // namespace tessel
