// The hybrid-parallel training loop behind `tessel train --nproc N` (thread ranks) and
// `tessel launch ... tessel train --backend gloo` (one process per rank): the config's
// `parallel:` section gives the degrees; each rank builds only its pieces of the model, runs
// its pipeline schedule, and steps its shard of the optimizer.
#pragma once

#include <map>
#include <vector>
#include <string>

#include "tessel/cli/trainer.h"
#include "tessel/parallel/sharded_optimizer.h"

namespace tessel {

struct ParallelTrainOptions {
  TrainOptions base;
  std::string trace_path;     // Chrome-trace/Perfetto JSON timeline (written by rank 0)
};

// Bytes this rank's allocator held during the training steps, by kind (MemoryKind): the
// highest mark of each kind, and of all of them together.
struct RankMemory {
  int64_t params = 0, grads = 0, optimizer = 0, other = 0, total = 0;
};

struct ParallelTrainResult {
  TrainResult train;                            // steps as every rank saw them
  std::map<std::string, Tensor> final_params;   // whole parameters this rank held (base.collect_params)
  std::vector<double> idle_shares;              // this rank's pipeline idle share per step
  std::vector<std::vector<double>> rank_idle_shares;  // every rank's (thread backend)
  RankMemory memory;                            // what this rank's allocator saw
};

// Runs on every rank of an initialised world (world_group() of dp·tp·pp ranks).
ParallelTrainResult train_parallel_rank(const RunConfig& config, const ParallelTrainOptions& options);

// What single-rank training has and parallel layouts do not yet (writing and resuming
// checkpoints): throws naming it. Both entry points call it; `tessel train` calls it
// first, so the refusal is bad input (exit 2) rather than a failed run.
void check_parallel_supports(const ParallelTrainOptions& options);

// `--nproc N` on the thread backend: spawns N ranks in this process; returns rank 0's result
// with the whole parameters of every rank (base.collect_params).
ParallelTrainResult train_parallel_threads(const RunConfig& config, int nproc, const ParallelTrainOptions& options);

}  // namespace tessel
