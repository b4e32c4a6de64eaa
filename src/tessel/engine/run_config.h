// A training run as values: the model, data, train (optimizer, schedule, batch), log and
// parallel (the strategy) sections of a training config, after defaults and checks. The engine
// runs one; the CLI reads one from YAML (tessel/cli/config.h) and a program may fill one in
// directly.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessel/core/json.h"
#include "tessel/data/dataset.h"
#include "tessel/nn/models.h"
#include "tessel/parallel/layout.h"

namespace tessel {

struct ModelSection {
  std::string arch;        // gpt2 | llama
  nn::Gpt2Config gpt2;
  nn::LlamaConfig llama;
  std::string init_from;   // optional safetensors weights (Hugging Face names)
};

struct DataSection {
  std::string path;
  TokenFormat format = TokenFormat::text;
  SampleOrder order = SampleOrder::random;
  // Validation tokens: a file of the same format, or the last `val_fraction` of `path` held
  // out (training then reads only the part before it). Neither: no evaluation.
  std::string val_path;
  double val_fraction = 0;
  // Packed documents: documents separated by the end-of-text token eot_token attend only
  // within themselves, their positions restarting at each (data/loader.h, pack_documents).
  bool pack_documents = false;
  int64_t eot_token = -1;
  bool has_validation() const { return !val_path.empty() || val_fraction > 0; }
};

struct TrainSection {
  int64_t steps = 100, global_batch = 8, micro_batch = 0, seq_len = 128;
  double lr = 1e-3, min_lr = -1;  // -1: lr / 10
  std::string schedule = "cosine";
  int64_t warmup = 0;
  double weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, grad_clip = 1.0;
  uint64_t seed = 1337;
  double dropout = -1;  // -1: the model section's own
  std::string optimizer = "adamw";  // adamw | sgd
  double momentum = 0.9;
  bool nesterov = false;
  int64_t save_every = 0;  // 0: only at the end
  bool save_init = false;
  int64_t keep_last = 0;   // > 0: keep only the newest keep_last checkpoints
  bool async_save = true;  // periodic saves written by a background thread while training goes on
  // > 0: also a checkpoint every this many steps in memory (a tmpfs folder, the node's RAM: it
  // outlives the processes, not the machine), kept once; a restarted or re-planned run resumes
  // from it when it is newer than --save's. Under `tessel launch` only (see TrainOptions).
  int64_t memory_save_every = 0;
  std::string memory_dir;  // "": /dev/shm/tessel-<uid>-<job id> (removed when the job ends)
  int64_t threads = 0;  // 0: TESSEL_NUM_THREADS / OMP_NUM_THREADS / all cores
  // Where the model, its states and the step run: cpu, cuda (each rank its local GPU), or
  // guarded (the CPU test device whose memory host code may not touch; docs/devices.md).
  std::string device = "cpu";
  // f32, or bf16 mixed precision: products (GEMMs, attention) in bf16 with f32 accumulation,
  // norms, softmax and the loss in f32, the weights, their gradients and the optimizer's
  // states in f32 (docs/precision.md).
  std::string precision = "f32";
  // The dtype data-parallel gradient buckets travel and are summed in: f32, or bf16 (half the
  // bytes on the wire; each sum rounded to bf16).
  std::string grad_reduce = "f32";
  // With validation data: the validation loss every `eval_every` steps (0: at the start and the
  // end only) over `eval_batches` fixed global batches read in order from the validation tokens.
  int64_t eval_every = 0, eval_batches = 4;
  // Whether the validation loss is taken after step `step` (0-based): every eval_every steps
  // and after the last.
  bool evaluates_after(int64_t step) const {
    return (eval_every > 0 && (step + 1) % eval_every == 0) || step + 1 == steps;
  }

  // "" or, when warm-up outlasts the run, a clause for the run's first log line saying so.
  std::string warmup_note() const;
  // "" or, when train.dropout replaced model rates that differ from it, a warning naming them.
  std::string dropout_note;
  // "" or a warning per key of the other optimizer the config gives (train.momentum under adamw...).
  std::string optimizer_note;
};

struct LogSection {
  int64_t every = 10;
  std::string metrics;  // JSONL path (or --metrics)
};

struct RunConfig;
// The values a run's trajectory depends on, as the run uses them (defaults filled in), by key
// path: {"train.lr": "0.002", "model.n_layer": "4", ...}. Kept in checkpoints, so a resume can
// name what it changes.
Json trajectory_settings(const RunConfig& c);

struct RunConfig {
  ModelSection model;
  DataSection data;
  TrainSection train;
  LogSection log;
  parallel::ParallelConfig parallel;  // degrees 1 when the config has no `parallel:` section
  // parallel.timeout_s: the timeout of every collective and store call, in seconds (0: not
  // given — `tessel train --timeout`, else the launcher's, else 300 s; comm/store.h).
  double timeout_s = 0;
  Json resolved;  // every setting after defaults and overrides, for the checkpoint's record

  int64_t micro_batches() const { return train.global_batch / train.micro_batch; }
};

// Builds the model the config describes (not materialised).
std::unique_ptr<nn::LanguageModel> build_model(const RunConfig& config);

}  // namespace tessel
