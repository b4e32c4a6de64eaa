// Tracing a rank's training step in meta mode over a trace world.
#include "tessel/engine/trace.h"

#include <exception>
#include <thread>

#include "tessel/comm/trace_backend.h"
#include "tessel/comm/world.h"
#include "tessel/core/context.h"

namespace tessel {

CommStats RankTrace::comm() const {
  CommStats out;
  for (const GroupStats& g : groups) out += g.stats;
  return out;
}

RankTrace trace_rank_step(const RunConfig& config, int rank, int steps) {
  TESSEL_CHECK(steps >= 1, "trace_rank_step: {} steps", steps);
  const int world_size = static_cast<int>(config.parallel.world_size());
  TESSEL_CHECK(rank >= 0 && rank < world_size, "trace_rank_step: rank {} of a world of {}", rank, world_size);
  RankTrace out;
  out.rank = rank;
  std::exception_ptr error;
  std::thread worker([&] {
    try {
      RankContextScope context(make_rank_context(rank, world_size, 1));
      MetaModeScope meta;
      std::shared_ptr<ProcessGroup> world = make_trace_world(world_size, rank);
      set_world_group(world);
      RunConfig cfg = config;
      cfg.train.steps = steps;
      cfg.train.save_every = 0;
      cfg.train.eval_every = 0;
      cfg.train.memory_save_every = 0;
      cfg.data.val_path.clear();  // a training step: no validation
      cfg.data.val_fraction = 0;
      Engine engine(cfg);
      // Each group's counters before the last step, to keep that step's share.
      std::map<std::string, CommStats> before;
      ParallelTrainOptions opts{.base = TrainOptions{.progress = false, .quiet = true}};
      int64_t seen = 0;
      opts.on_step = [&](const StepRecord&) {
        if (++seen != steps - 1) return;
        for (const GroupStats& g : world->stats_by_group()) before[g.name] = g.stats;
        reset_op_trace();
      };
      if (steps == 1) reset_op_trace();
      const ParallelTrainResult r = engine.fit(opts);
      out.memory = r.memory;
      out.ops = op_trace();
      for (GroupStats& g : world->stats_by_group()) {
        g.stats = g.stats - before[g.name];
        if (!g.stats.ops.empty()) out.groups.push_back(std::move(g));
      }
    } catch (...) {
      error = std::current_exception();
    }
  });
  worker.join();
  if (error) std::rethrow_exception(error);
  return out;
}

RunConfig block_trace_config(const plan::ModelSpec& m, const plan::LayerShape& s, int layers) {
  RunConfig cfg;
  if (m.arch == "gpt") {
    cfg.model.arch = "gpt2";
    nn::Gpt2Config& g = cfg.model.gpt2;
    g.n_layer = layers;
    g.n_embd = m.hidden;
    g.n_head = m.heads;
    g.vocab_size = m.vocab;
    g.n_positions = m.seq;
    g.dropout = m.dropout;
    g.attn_dropout = m.attn_dropout;
    g.embd_dropout = m.embd_dropout;
  } else {
    cfg.model.arch = "llama";
    nn::LlamaConfig& l = cfg.model.llama;
    l.num_hidden_layers = layers;
    l.hidden_size = m.hidden;
    l.num_attention_heads = m.heads;
    l.num_key_value_heads = m.kv_heads;
    l.intermediate_size = m.ffn;
    l.vocab_size = m.vocab;
    l.max_position_embeddings = m.seq;
    if (m.is_moe() && s.moe) {
      // Every block sparse (the block traced is a sparse one); a dense block of a mixture of
      // experts (s.moe false) is a Llama block of width ffn.
      cfg.model.arch = "mixtral";
      nn::MoeConfig& e = l.moe;
      e.num_experts = m.experts;
      e.top_k = m.top_k;
      e.expert_hidden = m.ffn;
      e.capacity_factor = m.capacity_factor;
      e.shared_expert_hidden = m.shared_ffn;
      l.moe_every = 1;
    }
  }
  cfg.train.steps = 1;
  cfg.train.seq_len = m.seq;
  cfg.train.threads = 1;
  cfg.log.every = 1000;
  parallel::ParallelConfig& p = cfg.parallel;
  p.tp = s.tp;
  p.sp = s.sp;
  p.cp = s.cp;
  p.cp_method = s.cp_method;
  p.ep = s.moe ? s.ep : 1;
  p.recompute = s.recompute;
  p.micro_batches = 1;
  // Expert-parallel ranks split the batch: each of them gets s.micro_batch sequences.
  cfg.train.global_batch = cfg.train.micro_batch = s.micro_batch * p.ep;
  return cfg;
}

void apply_layout(RunConfig& config, const plan::Layout& l) {
  parallel::ParallelConfig& p = config.parallel;
  p.dp = l.dp;
  p.tp = l.tp;
  p.pp = l.pp;
  p.ep = l.ep;
  p.cp = l.cp;
  p.cp_method = l.cp_method;
  p.vpp = l.vpp;
  p.sharding_stage = l.sharding_stage;
  p.sp = l.sp;
  p.micro_batches = l.micro_batches;
  p.schedule = l.schedule;
  p.recompute = l.recompute;
  p.bucket_mb = l.bucket_mb;
  p.stage_layers.clear();
  config.train.micro_batch = config.train.global_batch / l.micro_batches;
}

std::vector<plan::TracedCollective> collectives_by_dim(const RankTrace& t, const parallel::ParallelConfig& config) {
  std::vector<plan::TracedCollective> out;
  const parallel::Layout layout(config, t.rank);
  for (const GroupStats& g : t.groups) {
    std::string dim = g.ranks.size() == 1 ? "self" : "world";
    for (std::string_view d : parallel::ParallelConfig::kMeshDims) {
      if (g.name == "world") break;  // the world's own calls (loss, norm), even when it is one dim's size
      if (!layout.has_dim(d) || layout.degree(d) != static_cast<int64_t>(g.ranks.size()) || g.ranks.size() == 1) continue;
      bool same = true;
      for (int64_t i = 0; i < layout.degree(d) && same; ++i) same = layout.peer(d, i) == g.ranks[static_cast<size_t>(i)];
      if (same) dim = std::string(d);
    }
    for (const auto& [kind, e] : g.stats.ops) out.push_back(plan::TracedCollective{dim, kind, e.calls, e.bytes});
  }
  return out;
}

void install_block_tracer() {
  if (plan::has_block_tracer()) return;  // keep the blocks traced so far
  plan::set_block_tracer([](const plan::ModelSpec& m, const plan::LayerShape& s, int layers) {
    const RunConfig cfg = block_trace_config(m, s, layers);
    const RankTrace t = trace_rank_step(cfg, 0, 1);
    plan::StepTrace out;
    out.ops = t.ops;
    out.comm = collectives_by_dim(t, cfg.parallel);
    return out;
  });
  plan::set_step_tracer([](const plan::ModelSpec& m, const plan::Layout& l, int64_t global_batch, int stage) {
    plan::LayerShape whole;
    whole.moe = m.is_moe();
    RunConfig cfg = block_trace_config(m, whole, static_cast<int>(m.layers));
    cfg.model.llama.moe_every = m.moe_every;  // the model's own dense and sparse blocks
    cfg.train.global_batch = global_batch;
    apply_layout(cfg, l);
    // The stage's first rank (dp, tp coordinate 0), two steps: the first makes the optimizer's states.
    const int rank = static_cast<int>(parallel::Layout(cfg.parallel, 0).peer("pp", stage));
    const RankTrace t = trace_rank_step(cfg, rank, 2);
    const RankMemory& r = t.memory;
    plan::TracedStep out;
    out.memory = plan::TracedMemory{static_cast<double>(r.params), static_cast<double>(r.grads),
                                    static_cast<double>(r.optimizer), static_cast<double>(r.total)};
    out.comm = collectives_by_dim(t, cfg.parallel);
    out.copy_bytes = t.ops.bytes("bucket_copy");
    out.rank = rank;
    return out;
  });
}

}  // namespace tessel
