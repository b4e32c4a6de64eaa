// MoE step metrics (moe_metrics.h).
#include "tessel/engine/moe_metrics.h"

#include <vector>

#include "tessel/nn/moe.h"

namespace tessel {

void begin_moe_step(int64_t micro_batches) {
  nn::moe_step() = nn::MoeStep{.loss_scale = 1.0 / static_cast<double>(micro_batches), .record = true};
}

Json end_moe_step(const nn::LanguageModel& model, ProcessGroup& world) {
  nn::MoeStep& step = nn::moe_step();
  step.record = false;
  const auto* llama = dynamic_cast<const nn::Llama*>(&model);
  if (llama == nullptr || !llama->config().is_moe()) return Json();
  const nn::LlamaConfig& c = llama->config();
  const int64_t E = c.moe.num_experts;
  constexpr int64_t kFields = 6;  // aux_sum, sequences, z_sum, tokens, assignments, dropped
  std::vector<int64_t> layers;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    if (c.moe_block(i)) layers.push_back(i);
  const int64_t per = kFields + E;
  std::vector<double> v(layers.size() * static_cast<size_t>(per), 0.0);
  for (size_t l = 0; l < layers.size(); ++l) {
    auto it = step.layers.find(layers[l]);
    if (it == step.layers.end()) continue;  // another pipeline stage's block
    const nn::MoeLayerStats& s = it->second;
    double* at = &v[l * static_cast<size_t>(per)];
    at[0] = s.aux_sum, at[1] = s.sequences, at[2] = s.z_sum, at[3] = s.tokens, at[4] = s.assignments, at[5] = s.dropped;
    for (size_t e = 0; e < s.tokens_per_expert.size(); ++e) at[kFields + static_cast<int64_t>(e)] = s.tokens_per_expert[e];
  }
  step.layers.clear();
  world.all_reduce(v.data(), static_cast<int64_t>(v.size()), DType::f64, ReduceOp::sum);

  Json out = Json::Object{};
  Json::Array per_layer;
  double aux = 0, sequences = 0, z = 0, tokens = 0, assignments = 0, dropped = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    const double* at = &v[l * static_cast<size_t>(per)];
    Json layer = Json::Object{};
    layer["layer"] = layers[l];
    layer["aux_loss"] = at[1] > 0 ? at[0] / at[1] : 0.0;
    layer["z_loss"] = at[3] > 0 ? at[2] / at[3] : 0.0;
    layer["dropped_fraction"] = at[4] > 0 ? at[5] / at[4] : 0.0;
    Json::Array load;
    for (int64_t e = 0; e < E; ++e) load.push_back(static_cast<int64_t>(at[kFields + e]));
    layer["tokens_per_expert"] = Json(std::move(load));
    per_layer.push_back(std::move(layer));
    aux += at[0], sequences += at[1], z += at[2], tokens += at[3], assignments += at[4], dropped += at[5];
  }
  out["aux_loss"] = sequences > 0 ? aux / sequences : 0.0;
  out["z_loss"] = tokens > 0 ? z / tokens : 0.0;
  out["dropped_fraction"] = assignments > 0 ? dropped / assignments : 0.0;
  out["layers"] = Json(std::move(per_layer));
  return out;
}

}  // namespace tessel
