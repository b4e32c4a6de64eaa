// The engine: one training loop for every layout, one rank being a world of one, in the shape of
// the Engine of the system tessel is modelled on: built from the model, its loss, the optimizer
// and the strategy (here all in a RunConfig: model, train and parallel sections), it fits on the
// training data, evaluates the validation loss and predicts logits. Each rank builds only its
// pieces of the model (parallelize), runs its pipeline schedule (PipelineRuntime), steps its
// shard of the optimizer (ShardedOptimizer), and the metrics, the step log, the divergence check
// and the timeline live here once; `tessel train` only parses arguments and calls it.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessel/engine/training.h"
#include "tessel/nn/models.h"

namespace tessel {

struct ParallelTrainOptions {
  TrainOptions base;
  std::string trace_path;     // Chrome-trace/Perfetto JSON timeline (written by rank 0)
  std::function<void(const StepRecord&)> on_step;  // sees every step's record (every rank)
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
  int64_t resume_bytes_read = 0;                // tensor bytes this rank read from the checkpoint it resumed from
  std::vector<double> save_block_seconds;       // how long each background save held training (planning, and
                                                // the next update waiting for the writer)
  std::vector<double> memory_save_seconds;      // how long each in-memory checkpoint held training
};

class Engine {
 public:
  // On every rank of an initialised world (world_group() of dp·tp·pp ranks): builds this rank's
  // pieces of `model` (the config's model when null; it is never materialised whole) laid out
  // by config.parallel, the optimizer of config.train, and opens the config's data.
  explicit Engine(RunConfig config, std::unique_ptr<nn::LanguageModel> model = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Trains for config.train.steps steps from where the engine stands (a second fit goes on).
  // Every rank returns the steps as every rank saw them. With base.resume_dir it first loads
  // that checkpoint (when the engine is still at step 0); with base.save_dir it saves every
  // train.save_every steps and at the end (and at step 0 with train.save_init).
  ParallelTrainResult fit(const ParallelTrainOptions& options = {});
  // Collectively writes this run's distributed checkpoint — each rank its own pieces of the
  // parameters and optimizer states — as DIR/step-NNNNNN (the step the engine stands at) and
  // returns that folder (docs/checkpoint.md).
  std::string save(const std::string& dir);
  // Collectively loads a checkpoint saved in any layout (a step folder, or the newest complete
  // one under DIR): each rank reads only the bytes of its own pieces. Returns the step the
  // engine now stands at.
  int64_t load(const std::string& path);
  // The step the next fit starts from.
  int64_t step() const;
  // Tensor bytes this rank read from the files in its last load.
  int64_t resume_bytes_read() const;
  // The validation loss over the config's fixed validation batches, forward only through the
  // pipeline, no dropout: the single-rank trainer's figure, on every rank. Throws when the
  // config has no validation data.
  double evaluate();
  // The logits [B, T, vocab] of token ids [B, T] (every rank passes the same), forward only and
  // without dropout, whole on every rank. Layouts with pipeline stages are refused for now.
  Tensor predict(const Tensor& ids);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// `--nproc N` on the thread backend: spawns N ranks in this process, each fitting an Engine of
// `config`; returns rank 0's result with the whole parameters of every rank (base.collect_params).
ParallelTrainResult train_parallel_threads(const RunConfig& config, int nproc, const ParallelTrainOptions& options);

}  // namespace tessel
