// Tiny training configs over the shipped corpus, and the losses of a run: what the trainer
// tests (train_test.cc, device_train_test.cc) train and compare.
#pragma once

#include <string>
#include <vector>

#include "tessel/engine/training.h"

namespace tessel::testing {

inline std::string corpus() { return std::string(TESSEL_SOURCE_DIR) + "/data/kjv.txt"; }

// GPT-2 (with dropout 0.1), Llama (any other arch but mixtral) or Mixtral (dropless MoE), two
// blocks of width 32, `steps` steps of 4 x 16 tokens on one thread.
inline std::string tiny_yaml(const std::string& arch, int steps = 20) {
  std::string model;
  if (arch == "gpt2")
    model = "model: {arch: gpt2, n_layer: 2, n_embd: 32, n_head: 2, vocab_size: 256, n_positions: 32}\n";
  else if (arch == "mixtral")
    model = "model: {arch: mixtral, num_hidden_layers: 2, hidden_size: 32, num_attention_heads: 4, "
            "num_key_value_heads: 2, intermediate_size: 48, vocab_size: 256, max_position_embeddings: 32, "
            "num_local_experts: 4, num_experts_per_tok: 2, router_aux_loss_coef: 0.01, router_z_loss_coef: 0.001}\n";
  else
    model = "model: {arch: llama, num_hidden_layers: 2, hidden_size: 32, num_attention_heads: 4, num_key_value_heads: 2,"
            " intermediate_size: 48, vocab_size: 256, max_position_embeddings: 32}\n";
  // Llama has no dropout layers, and a config that asks it for dropout is refused.
  const std::string dropout = arch == "gpt2" ? " dropout: 0.1," : "";
  return model + "data: {path: " + corpus() +
         ", format: text, order: random}\n"
         "train: {steps: " + std::to_string(steps) +
         ", global_batch: 4, micro_batch: 2, seq_len: 16, lr: 3.0e-3, warmup: 3, schedule: cosine,"
         " seed: 5," + dropout + " threads: 1}\n"
         "log: {every: 5}\n";
}

// The layout subset the device and precision tests train (dp, tp+sp, pp, ZeRO-3, cp ring, ep),
// each on the tiny model of its arch, as gtest parameters named by `name`.
struct LayoutCase {
  const char* name;
  const char* arch;
  std::vector<std::string> sets;
};
inline const std::vector<LayoutCase>& layout_subset() {
  static const std::vector<LayoutCase> cases{{"dp", "gpt2", {"parallel.dp=2"}},
                                             {"tp_sp", "gpt2", {"parallel.tp=2", "parallel.sp=true"}},
                                             {"pp", "gpt2", {"parallel.pp=2"}},
                                             {"zero3", "gpt2", {"parallel.dp=2", "parallel.sharding_stage=3"}},
                                             {"cp_ring", "llama", {"parallel.cp=2"}},
                                             {"ep", "mixtral", {"parallel.ep=2"}}};
  return cases;
}
inline std::string layout_name(const LayoutCase& c) { return c.name; }

inline std::vector<double> losses(const TrainResult& r) {
  std::vector<double> out;
  for (const StepRecord& s : r.steps) out.push_back(s.loss);
  return out;
}

}  // namespace tessel::testing
