// Run configs: what follows from the values alone.
#include "tessel/engine/run_config.h"

#include <type_traits>

namespace tessel {

std::string TrainSection::warmup_note() const {
  if (warmup <= steps) return "";
  return fmt::format("; train.warmup ({}) is longer than the run, so the learning rate rises for all {} step{} and "
                     "ends at {:.3g}",
                     warmup, steps, steps == 1 ? "" : "s",
                     lr * static_cast<double>(steps) / static_cast<double>(warmup));
}

Json trajectory_settings(const RunConfig& c) {
  Json out = Json::Object{};
  // Ten significant digits: lr / 10 reads 0.0003, not 0.00030000000000000003.
  auto put = [&](const std::string& key, const auto& value) {
    if constexpr (std::is_floating_point_v<std::decay_t<decltype(value)>>)
      out[key] = fmt::format("{:.10g}", value);
    else
      out[key] = fmt::format("{}", value);
  };
  auto ints = [&](std::initializer_list<std::pair<const char*, int64_t>> kv) {
    for (const auto& [key, v] : kv) put(key, v);
  };
  auto reals = [&](std::initializer_list<std::pair<const char*, double>> kv) {
    for (const auto& [key, v] : kv) put(key, v);
  };
  const ModelSection& m = c.model;
  put("model.arch", m.arch);
  if (m.arch == "gpt2") {
    const nn::Gpt2Config& g = m.gpt2;
    ints({{"model.n_layer", g.n_layer}, {"model.n_embd", g.n_embd}, {"model.n_head", g.n_head},
          {"model.vocab_size", g.vocab_size}, {"model.n_positions", g.n_positions}});
    reals({{"model.layer_norm_epsilon", g.layer_norm_epsilon}, {"model.initializer_range", g.initializer_range},
           {"model.dropout", g.dropout}});
    // The embedding's and attention's rates only where they differ from the residual one (so a
    // checkpoint written before they existed records the same settings).
    if (g.embd_rate() != g.dropout) put("model.embd_dropout", g.embd_rate());
    if (g.attn_rate() != g.dropout) put("model.attn_dropout", g.attn_rate());
  } else {
    const nn::LlamaConfig& l = m.llama;
    ints({{"model.num_hidden_layers", l.num_hidden_layers}, {"model.hidden_size", l.hidden_size},
          {"model.num_attention_heads", l.num_attention_heads}, {"model.num_key_value_heads", l.num_key_value_heads},
          {"model.intermediate_size", l.intermediate_size}, {"model.vocab_size", l.vocab_size},
          {"model.max_position_embeddings", l.max_position_embeddings}});
    reals({{"model.rope_theta", l.rope_theta}, {"model.rms_norm_eps", l.rms_norm_eps},
           {"model.initializer_range", l.initializer_range}});
    if (l.is_moe()) {
      const nn::MoeConfig& e = l.moe;
      ints({{"model.num_local_experts", e.num_experts}, {"model.num_experts_per_tok", e.top_k},
            {"model.decoder_sparse_step", l.moe_every}, {"model.shared_expert_intermediate_size", e.shared_expert_hidden}});
      reals({{"model.capacity_factor", e.capacity_factor}, {"model.router_aux_loss_coef", e.aux_loss_coef},
             {"model.router_z_loss_coef", e.z_loss_coef}});
      put("model.router_scores", e.scores);
      put("model.norm_topk_prob", e.renormalize ? "true" : "false");
    }
  }
  const DataSection& d = c.data;
  put("data.path", d.path);
  put("data.format", token_format_name(d.format));
  put("data.order", sample_order_name(d.order));
  put("data.val_fraction", d.val_fraction);
  const TrainSection& t = c.train;
  // Not the micro-batch count: like the layout, it changes how a step is computed, not what.
  ints({{"train.global_batch", t.global_batch}, {"train.seq_len", t.seq_len},
        {"train.warmup", t.warmup}, {"train.seed", static_cast<int64_t>(t.seed)}});
  reals({{"train.lr", t.lr}, {"train.min_lr", t.min_lr}, {"train.weight_decay", t.weight_decay},
         {"train.grad_clip", t.grad_clip}});
  put("train.schedule", t.schedule);
  put("train.optimizer", t.optimizer);
  // Only where not f32, so a checkpoint written before they existed records the same settings.
  if (t.precision != "f32") put("train.precision", t.precision);
  if (t.grad_reduce != "f32") put("train.grad_reduce", t.grad_reduce);
  if (t.optimizer == "adamw") {
    reals({{"train.beta1", t.beta1}, {"train.beta2", t.beta2}, {"train.eps", t.eps}});
  } else {
    put("train.momentum", t.momentum);
    put("train.nesterov", t.nesterov);
  }
  return out;
}

std::unique_ptr<nn::LanguageModel> build_model(const RunConfig& config) {
  std::unique_ptr<nn::LanguageModel> model;
  if (config.model.arch == "gpt2") model = std::make_unique<nn::Gpt2>(config.model.gpt2);
  else model = std::make_unique<nn::Llama>(config.model.llama);
  // Both training loops build their model here, so parallel.recompute: selective holds on one rank too.
  model->set_selective_recompute(config.parallel.recompute == "selective");
  return model;
}

}  // namespace tessel
