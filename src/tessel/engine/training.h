// What every training loop shares: the options a run takes, the record of a step and of a run,
// the training and validation tokens a config names, and the step's log line and metrics line.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessel/core/json.h"
#include "tessel/data/dataset.h"
#include "tessel/data/loader.h"
#include "tessel/engine/run_config.h"

namespace tessel {

struct TrainOptions {
  std::string metrics_path;  // JSONL, one line per step (overrides log.metrics)
  std::string save_dir;      // checkpoints go to save_dir/step-NNNNNN/
  std::string resume_dir;    // a step folder or a folder of them (the newest is used)
  // With train.memory_save_every: where the in-memory checkpoints go (tmpfs). A resume from
  // resume_dir also considers the step folders here, and takes the newest complete one.
  std::string memory_dir;
  // With resume_dir: when neither it nor memory_dir holds a complete checkpoint, start at step
  // 0 instead of failing (a restart that came before the first save).
  bool resume_optional = false;
  bool progress = true;      // live line on a terminal, plain lines otherwise
  bool quiet = false;        // no log lines (tests)
  bool collect_params = false;  // return the final parameters (tests compare layouts with them)
  // With save_dir: SIGINT/SIGTERM end the run after the step in progress, with a checkpoint
  // of where it stopped (a second signal stops at once). `tessel train` sets it.
  bool stop_on_signal = false;
};

struct StepRecord {
  int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, seconds = 0;
  std::optional<double> val_loss;  // the validation loss after this step's update, when evaluated
  // Mixture-of-experts models: the step's router record summed over the ranks (moe_metrics.h).
  Json moe;
};

struct TrainResult {
  std::vector<StepRecord> steps;  // one per step run (not including resumed-over steps)
  std::string last_checkpoint;
  int stopped_by = 0;  // the signal that ended the run early (TrainOptions::stop_on_signal), else 0
  std::map<std::string, Tensor> final_params;  // with TrainOptions::collect_params
  // With validation data: (updates applied, validation loss), from step 0 when the run starts
  // there (before any update).
  std::vector<std::pair<int64_t, double>> validation;
  double seconds = 0;
};

// The training tokens and, when the config has them, the validation tokens with the batches
// every evaluation reads: global batches 0 .. validation_batches-1 of their sequential order,
// the same at every evaluation and for every run and layout of the config. With
// data.val_fraction the validation tokens are the tail of the training file and training
// reads only the part before it.
struct TrainingData {
  std::shared_ptr<TokenDataset> train;
  std::shared_ptr<const TokenDataset> validation;  // null without validation
  std::optional<Sampler> validation_order;
  int64_t validation_batches = 0;
};

// Opens them, checking every token id against `vocab_size`.
TrainingData open_training_data(const RunConfig& config, int64_t vocab_size);

// "validation loss before training: 5.5451 (4 batches of 16 x 128 tokens)"
std::string initial_validation_line(double loss, const RunConfig& config);

// The log line of a step: "step 5/300  loss 4.1671  lr 3.33e-04  grad_norm 3.214  4.1k tok/s
// ETA 2m03s", with "  val_loss 4.0864" when it evaluated.
std::string step_line(const StepRecord& r, int64_t total_steps, double eta_seconds);

// A step's line of the JSONL metrics: step, loss, lr, grad_norm, tokens_per_s, step_time_s,
// elapsed_s (seconds since the first step began), and val_loss when it evaluated.
Json step_metrics(const StepRecord& r, double elapsed_s);

// The values of `now` that differ from a checkpoint's `then`, both trajectory_settings():
// "train.global_batch 16 -> 8".
std::vector<std::string> changed_settings(const Json& then, const Json& now);

// "1m05s", "2h03m"; "?" when not finite.
std::string duration_str(double seconds);
// "812.0 KiB", "12.43 MiB", "1.39 GiB".
std::string bytes_str(int64_t bytes);
// "812", "4.1k", "1.25M" (tokens per second).
std::string rate_str(double tokens_per_s);

}  // namespace tessel
