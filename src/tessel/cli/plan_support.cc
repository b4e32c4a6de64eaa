#include "tessel/cli/plan_support.h"

#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tessel/cli/cluster_detect.h"
#include "tessel/core/error.h"
#include "tessel/core/input_file.h"
#include "tessel/engine/trace.h"
#include "tessel/plan/model_spec.h"

namespace tessel {

plan::ModelSpec model_spec_of(const RunConfig& config) {
  const int64_t seq = config.train.seq_len;
  plan::ModelSpec m;
  if (config.model.arch == "llama" || config.model.arch == "mixtral") {
    const nn::LlamaConfig& l = config.model.llama;
    m = plan::llama_spec(config.model.arch, l.num_hidden_layers, l.hidden_size, l.num_attention_heads,
                         l.num_key_value_heads, l.intermediate_size, l.vocab_size, seq);
    if (config.model.arch == "mixtral") {
      const nn::MoeConfig& e = l.moe;
      m.arch = "mixtral";
      m.experts = e.num_experts;
      m.top_k = e.top_k;
      m.ffn = e.expert_hidden > 0 ? e.expert_hidden : l.intermediate_size;
      m.moe_every = l.moe_every;
      m.shared_ffn = e.shared_expert_hidden;
      m.capacity_factor = e.capacity_factor;
    }
  } else {
    const nn::Gpt2Config& g = config.model.gpt2;
    m = plan::gpt_spec(config.model.arch, g.n_layer, g.n_embd, g.n_head, g.vocab_size, seq);
    m.dropout = config.train.dropout >= 0 ? config.train.dropout : g.dropout;
    if (config.train.dropout < 0) {  // (train.dropout sets all three rates)
      m.attn_dropout = g.attn_dropout;
      m.embd_dropout = g.embd_dropout;
    }
  }
  plan::validate(m);
  return m;
}

plan::ModelSpec resolve_model(const std::string& text, RunConfig* config_out) {
  if (plan::is_model_preset(text)) return plan::model_preset(text);
  // Not a file (the error_code form: a name too long to look up is no file either): the preset
  // list, or the reason the file cannot be read when the name looks like a path.
  std::error_code ec;
  if (!std::filesystem::exists(text, ec)) {
    if (text.find('/') != std::string::npos || text.ends_with(".yaml") || text.ends_with(".yml"))
      check_input_file(text, "--model");
    plan::model_preset(text);  // throws listing the presets
  }
  // Planning reads the model and the train section's sizes: a config of a model alone plans.
  RunConfig cfg = load_run_config(text, {}, ConfigUse::planning);
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
      // Thread ranks of this machine, each measured with a thread of its own: bounded as
      // train.threads is.
      constexpr int kMaxLocalRanks = 1024;
      const std::string n = text.substr(base.size() + 1);
      auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), ranks);
      TESSEL_CHECK(ec == std::errc() && end == n.data() + n.size() && ranks > 0 && ranks <= kMaxLocalRanks,
                   "--cluster {}: expected local:N with N a number of thread ranks, 1 to {}", text, kMaxLocalRanks);
    }
    return local_cluster(ranks, verbose);
  }
  if (plan::is_cluster_preset(text)) return plan::cluster_preset(text);
  const std::string problem = input_file_problem(text);
  if (problem == "no such file")
    throw InputError(fmt::format("--cluster {}: not a preset ({}, local[:N]) nor a cluster YAML file", text,
                                 fmt::join(plan::cluster_preset_names(), ", ")));
  return plan::parse_cluster(read_input_file(text, "--cluster"), text);
}

namespace {

std::filesystem::path cluster_cache_file(int ranks) {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::filesystem::path dir = xdg != nullptr && *xdg != '\0' ? std::filesystem::path(xdg) / "tessel"
                              : home != nullptr && *home != '\0' ? std::filesystem::path(home) / ".cache" / "tessel"
                                                                   : std::filesystem::path();
  if (dir.empty()) return {};
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return dir / fmt::format("cluster-{}-{}ranks.yaml", host, ranks);
}

}  // namespace

plan::Cluster local_cluster(int ranks, bool verbose, bool fresh) {
  if (ranks <= 0) ranks = static_cast<int>(probe_topology().cores);
  const std::filesystem::path file = cluster_cache_file(ranks);
  std::error_code ec;
  if (!fresh && !file.empty() && std::filesystem::is_regular_file(file, ec)) {
    const auto age = std::filesystem::file_time_type::clock::now() - std::filesystem::last_write_time(file, ec);
    if (!ec && age < std::chrono::hours(24)) {
      try {
        plan::Cluster c = plan::parse_cluster(read_input_file(file.string(), "the cluster cache"), file.string());
        if (verbose)
          std::fprintf(stderr, "cluster: this machine as measured %.1f h ago (%s; `tessel cluster detect` measures again)\n",
                       std::chrono::duration<double, std::ratio<3600>>(age).count(), file.c_str());
        return c;
      } catch (const std::exception&) {
        // A damaged or old-format file: measure again and replace it.
      }
    }
  }
  plan::Cluster c = detect_local_cluster(ranks, verbose);
  if (!file.empty()) {
    // Written whole, then renamed: a reader never sees half a file. A failure costs only speed.
    std::filesystem::create_directories(file.parent_path(), ec);
    const std::filesystem::path tmp = file.string() + fmt::format(".{}.tmp", ::getpid());
    {
      std::ofstream out(tmp);
      out << c.to_yaml();
    }
    std::filesystem::rename(tmp, file, ec);
    if (ec) std::filesystem::remove(tmp, ec);
  }
  return c;
}

plan::Estimate auto_layout(const RunConfig& config, int ranks, bool verbose, const plan::Cluster* cluster) {
  plan::ModelSpec m = model_spec_of(config);
  plan::Cluster c = cluster != nullptr ? *cluster : local_cluster(ranks, verbose);
  install_block_tracer();  // blocks costed from the runtime's traced step, as `tessel plan` does
  plan::PlanOptions o;
  o.global_batch = config.train.global_batch;
  o.top = 1;
  plan::SearchResult r = plan::search(m, c, o);
  TESSEL_CHECK(!r.best.empty(), "--plan auto: no layout of {} ranks fits the model (global batch {}, {} layouts tried)",
               ranks, o.global_batch, r.candidates);
  return r.best.front();
}

}  // namespace tessel
