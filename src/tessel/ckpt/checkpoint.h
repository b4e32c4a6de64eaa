// Training checkpoints: DIR/step-NNNNNN/ holding model.safetensors (Hugging Face parameter
// names, so the weights load in transformers as they are), optimizer.safetensors (named
// optimizer state) and trainer.json (step, seed, data position and the run's config). A
// checkpoint is written to a temporary folder and renamed into place, so a crash never leaves
// a half-written step behind.
#pragma once

#include <string>

#include "tessel/core/json.h"
#include "tessel/nn/models.h"
#include "tessel/optim/optimizer.h"

namespace tessel {

// Every parameter of `model` by its full name.
std::map<std::string, Tensor> model_state(nn::Module& model);
void save_model(const std::string& path, nn::Module& model, const std::map<std::string, std::string>& metadata = {});
// Copies weights into the materialised parameters of `model`: the whole tensor, or this
// rank's piece of a distributed one (parameters another rank holds are left alone). Accepts
// Hugging Face GPT-2 files whose names lack the "transformer." prefix, skips keys the model
// declares ignorable (mask buffers), and requires every parameter of the model with a
// matching shape; throws CheckpointError naming the file and the tensor otherwise. Weights
// are converted to the parameters' dtype.
void load_model(const std::string& path, nn::LanguageModel& model);

struct TrainerState {
  int64_t step = 0;  // updates applied so far; training resumes at this step
  uint64_t seed = 0;
  Json config;       // the run's resolved config, for the record
  Json settings;     // the values its trajectory depends on, defaults filled in ({"train.lr": "0.002"})
};

// Creates DIR if needed and checks that a file can be written in it, so that a run with
// --save fails before its first step rather than at its first checkpoint.
void check_checkpoint_dir(const std::string& dir);
// Writes DIR/step-NNNNNN/ and returns its path.
std::string save_checkpoint(const std::string& dir, nn::LanguageModel& model, const optim::Optimizer* optimizer,
                            const TrainerState& state);
// Loads a step folder (or the newest step folder under DIR) into `model` and `optimizer`.
TrainerState load_checkpoint(const std::string& path, nn::LanguageModel& model, optim::Optimizer* optimizer);
// The newest DIR/step-NNNNNN folder, or `path` itself when it is a step folder.
std::string resolve_checkpoint(const std::string& path);

}  // namespace tessel
