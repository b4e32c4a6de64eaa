// Training checkpoints: DIR/step-NNNNNN/ holding model*.safetensors (Hugging Face parameter
// names, so the weights load in transformers as they are), optimizer*.safetensors (named
// optimizer state), trainer.json (step, seed and the run's config: the data position and the
// random streams follow from them) and the distributed-checkpoint index and manifest of
// sharded.h, which also say how a checkpoint is published safely.
#pragma once

#include <string>

#include "tessel/ckpt/sharded.h"
#include "tessel/core/json.h"
#include "tessel/nn/models.h"
#include "tessel/optim/optimizer.h"

namespace tessel {

// Every parameter of `model` by its full name.
std::map<std::string, Tensor> model_state(nn::Module& model);
// Replaces the stacked tensor `name` of `tensors` by one tensor per index of its dim 0, named as
// Hugging Face's files name them (nn::stacked_file_name).
void split_stacked(std::map<std::string, Tensor>& tensors, const std::string& name);
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
  Json layout;       // the layout it was saved from ({"world_size": 4, "parallel": "dp2 pp2 ..."}), for the record
  std::string dir;   // the step folder it was loaded from
};

// Creates DIR if needed and checks that a file can be written in it, so that a run with
// --save fails before its first step rather than at its first checkpoint.
void check_checkpoint_dir(const std::string& dir);
// Removes the temporary folders (.step-N.tmp) that saves killed part-way left in DIR, saying
// so with their sizes; a save another live process of this host is writing is left alone. Every
// run that opens a checkpoint folder calls it (the engine, on the lead rank).
void remove_unfinished_saves(const std::string& dir);
// Writes DIR/step-NNNNNN/ (this process alone; see sharded.h for the format and its
// durability) and returns its path; `keep_last` > 0 keeps only that many step folders.
std::string save_checkpoint(const std::string& dir, nn::LanguageModel& model, const optim::Optimizer* optimizer,
                            const TrainerState& state, int keep_last = 0);
// Loads a step folder (or the newest complete, undamaged one under DIR) into `model` and
// `optimizer` (this process alone, whatever layout saved it).
TrainerState load_checkpoint(const std::string& path, nn::LanguageModel& model, optim::Optimizer* optimizer);
// The newest complete step folder under DIR, or `path` itself when it is a step folder.
std::string resolve_checkpoint(const std::string& path);

// The pieces shared by every loop that checkpoints (engine.cc, the single-rank trainer):
// trainer.json's contents, and its fields read back (checking the model's architecture).
Json trainer_json(const nn::LanguageModel& model, const TrainerState& state);
TrainerState parse_trainer_json(const CheckpointReader& reader, const nn::LanguageModel& model);
// `params` as checkpoint tensors (their Hugging Face names and file shapes).
std::vector<CheckpointTensor> model_checkpoint_tensors(const std::vector<nn::Parameter*>& params);
// Optimizer states named "<parameter>.<slot>" as checkpoint tensors, in their parameter's file shape.
std::vector<CheckpointTensor> optimizer_checkpoint_tensors(nn::Module& model, const std::map<std::string, Tensor>& state);
// Throws naming the tensor when the checkpoint lacks a parameter of `model` or holds a model
// tensor that is not one.
void check_model_tensors(const CheckpointReader& reader, nn::LanguageModel& model);

}  // namespace tessel
