#include "tessel/cli/plan_support.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tessel/cli/cluster_detect.h"
#include "tessel/core/error.h"
#include "tessel/plan/model_spec.h"

namespace tessel {

plan::ModelSpec model_spec_of(const RunConfig& config) {
  const int64_t seq = config.train.seq_len;
  plan::ModelSpec m;
  if (config.model.arch == "llama") {
    const nn::LlamaConfig& l = config.model.llama;
    m = plan::llama_spec(config.model.arch, l.num_hidden_layers, l.hidden_size, l.num_attention_heads,
                         l.num_key_value_heads, l.intermediate_size, l.vocab_size, seq);
  } else {
    const nn::Gpt2Config& g = config.model.gpt2;
    m = plan::gpt_spec(config.model.arch, g.n_layer, g.n_embd, g.n_head, g.vocab_size, seq);
    m.dropout = config.train.dropout >= 0 ? config.train.dropout : g.dropout;
  }
  plan::validate(m);
  return m;
}

plan::ModelSpec resolve_model(const std::string& text, RunConfig* config_out) {
  if (plan::is_model_preset(text)) return plan::model_preset(text);
  if (!std::filesystem::exists(text)) plan::model_preset(text);  // throws listing the presets
  RunConfig cfg = load_run_config(text);
  plan::ModelSpec m = model_spec_of(cfg);
  m.name = std::filesystem::path(text).stem().string();
  if (config_out) *config_out = std::move(cfg);
  return m;
}

plan::Cluster resolve_cluster(const std::string& text, bool verbose) {
  const std::string base = text.substr(0, text.find(':'));
  if (base == "local") {
    int ranks = 0;
    if (base.size() < text.size()) {
      const std::string n = text.substr(base.size() + 1);
      try {
        ranks = std::stoi(n);
      } catch (const std::exception&) {
        ranks = 0;
      }
      TESSEL_CHECK(ranks > 0, "--cluster {}: expected local:N with N a positive number of thread ranks", text);
    }
    return detect_local_cluster(ranks, verbose);
  }
  if (plan::is_cluster_preset(text)) return plan::cluster_preset(text);
  std::ifstream in(text);
  TESSEL_CHECK(in.good(), "--cluster {}: not a preset ({}, local[:N]) nor a readable cluster YAML file", text,
               fmt::format("{}", fmt::join(plan::cluster_preset_names(), ", ")));
  std::stringstream ss;
  ss << in.rdbuf();
  return plan::parse_cluster(ss.str(), text);
}

plan::Estimate auto_layout(const RunConfig& config, int ranks, bool verbose) {
  plan::ModelSpec m = model_spec_of(config);
  plan::Cluster c = detect_local_cluster(ranks, verbose);
  plan::PlanOptions o;
  o.global_batch = config.train.global_batch;
  o.top = 1;
  plan::SearchResult r = plan::search(m, c, o);
  TESSEL_CHECK(!r.best.empty(), "--plan auto: no layout of {} ranks fits the model (global batch {}, {} layouts tried)",
               ranks, o.global_batch, r.candidates);
  return r.best.front();
}

void apply_layout(RunConfig& config, const plan::Layout& l) {
  parallel::ParallelConfig& p = config.parallel;
  p.dp = l.dp;
  p.tp = l.tp;
  p.pp = l.pp;
  p.vpp = l.vpp;
  p.sharding_stage = l.sharding_stage;
  p.sp = l.sp;
  p.micro_batches = l.micro_batches;
  p.schedule = l.schedule;
  p.recompute = l.recompute;
  p.stage_layers.clear();
  config.train.micro_batch = config.train.global_batch / l.micro_batches;
}

}  // namespace tessel
