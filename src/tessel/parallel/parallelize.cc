// parallelize and the ready plans.
#include "tessel/parallel/parallelize.h"

#include <set>

#include "tessel/core/context.h"
#include "tessel/core/error.h"
#include "tessel/dist/dtensor.h"
#include "tessel/parallel/expert.h"

namespace tessel::parallel {

namespace {

// '*' matches exactly one dot-separated part.
bool matches(const std::string& pattern, const std::string& path) {
  size_t i = 0, j = 0;
  while (i < pattern.size() && j <= path.size()) {
    if (pattern[i] == '*') {
      size_t end = path.find('.', j);
      j = end == std::string::npos ? path.size() : end;
      ++i;
    } else {
      if (j >= path.size() || pattern[i] != path[j]) return false;
      ++i;
      ++j;
    }
  }
  return i == pattern.size() && j == path.size();
}

// `t` with its placement on mesh dim `tp_dim` changed to `tp` (the others kept).
Tensor with_tp(const Tensor& t, int64_t tp_dim, const Placement& tp) {
  if (!is_dist(t)) return t;
  const DistAttr& a = dist_attr(t);
  const size_t at = static_cast<size_t>(tp_dim);
  if (a.placements.size() <= at || a.placements[at] == tp) return t;
  Placements want = a.placements;
  want[at] = tp;
  return reshard(t, a.mesh, want);
}

}  // namespace

Style ParallelPlan::style_of(const std::string& module_path) const {
  for (const PlanRule& r : rules)
    if (matches(r.pattern, module_path)) return r.style;
  return Style::replicate;
}

ParallelPlan gpt2_plan() {
  return {{{"transformer.wte", Style::vocabwise},
           {"transformer.h.*.attn.c_attn", Style::colwise},
           {"transformer.h.*.attn.c_proj", Style::rowwise},
           {"transformer.h.*.mlp.c_fc", Style::colwise},
           {"transformer.h.*.mlp.c_proj", Style::rowwise}}};
}

ParallelPlan llama_plan() {
  return {{{"model.embed_tokens", Style::vocabwise},
           {"model.layers.*.self_attn.q_proj", Style::colwise},
           {"model.layers.*.self_attn.k_proj", Style::colwise},
           {"model.layers.*.self_attn.v_proj", Style::colwise},
           {"model.layers.*.self_attn.o_proj", Style::rowwise},
           {"model.layers.*.mlp.gate_proj", Style::colwise},
           {"model.layers.*.mlp.up_proj", Style::colwise},
           {"model.layers.*.mlp.down_proj", Style::rowwise},
           {"lm_head", Style::colwise}}};
}

ParallelPlan mixtral_plan() {
  ParallelPlan plan = llama_plan();
  for (PlanRule r : std::vector<PlanRule>{{"model.layers.*.block_sparse_moe.experts.w1", Style::colwise},
                                          {"model.layers.*.block_sparse_moe.experts.w3", Style::colwise},
                                          {"model.layers.*.block_sparse_moe.experts.w2", Style::rowwise},
                                          {"model.layers.*.block_sparse_moe.shared_expert.gate_proj", Style::colwise},
                                          {"model.layers.*.block_sparse_moe.shared_expert.up_proj", Style::colwise},
                                          {"model.layers.*.block_sparse_moe.shared_expert.down_proj", Style::rowwise}})
    plan.rules.push_back(r);
  return plan;
}

ParallelPlan plan_for(const std::string& arch) {
  if (arch == "gpt2") return gpt2_plan();
  if (arch == "llama") return llama_plan();
  if (arch == "mixtral") return mixtral_plan();
  TESSEL_THROW("no parallel plan for model.arch '{}' (have: gpt2, llama, mixtral)", arch);
}

Placement tp_placement(const nn::Parameter& p, Style style, bool in_out_layout, bool bias) {
  if (p.file_stack) {
    // Stacked expert matrices [E, out, in] (Hugging Face's per-expert [out, in]): ColWise splits
    // each expert's output features, RowWise its input features; the expert dim is ep's.
    TESSEL_CHECK(p.shape.size() == 3, "parallel plan: stacked parameter '{}' must be [experts, out, in], got {}", p.name,
                 shape_str(p.shape));
    if (style == Style::colwise) return Shard(1);
    if (style == Style::rowwise) return Shard(2);
    return Replicate();
  }
  const bool matrix = p.shape.size() == 2;
  // The tensor dims holding a Linear's (last) output and its input features: a weight
  // [in, O1, O2, ...] (in_out) shards its last dim, so GPT-2's c_attn [C, 3, C] splits by heads.
  const int64_t last = static_cast<int64_t>(p.shape.size()) - 1;
  const int64_t out_dim = in_out_layout || bias ? last : 0, in_dim = in_out_layout ? 0 : 1;
  Placement tp = Replicate();
  switch (style) {
    case Style::replicate: break;
    case Style::colwise: tp = Shard(out_dim); break;  // weight, or bias [out...]
    case Style::rowwise: tp = bias ? Placement(Replicate()) : Placement(Shard(in_dim)); break;
    case Style::vocabwise: tp = matrix ? Placement(Shard(0)) : Placement(Replicate()); break;
  }
  return tp;
}

void parallelize(nn::LanguageModel& model, const std::vector<nn::Parameter*>& params, const ProcessMesh& mesh,
                 const ParallelPlan& plan, const Layout& layout, uint64_t seed) {
  const bool sp = layout.config().sp;
  const bool zero3 = layout.config().sharding_stage == 3;
  const std::set<const nn::Parameter*> wanted(params.begin(), params.end());
  for (nn::Module* m : model.modules()) {
    const Style style = plan.style_of(m->path());
    bool holds = false;
    for (nn::Parameter* p : m->own_parameters()) {
      if (!wanted.count(p)) continue;
      holds = true;
      auto* linear = dynamic_cast<nn::Linear*>(m);
      const bool in_out = linear != nullptr && linear->layout() == nn::Linear::Layout::in_out;
      TESSEL_CHECK(style == Style::replicate || style == Style::vocabwise || linear != nullptr || p->file_stack,
                   "parallel plan: '{}' is not a Linear, so it cannot be ColWise/RowWise", m->path());
      const Placement tp = tp_placement(*p, style, in_out, linear != nullptr && p == linear->bias());
      // Stacked experts are split over ep on their expert dim.
      const Placement ep = p->file_stack ? Placement(Shard(0)) : Placement(Replicate());
      const Placements gathered = layout.placements({{"ep", ep}, {"tp", tp}});
      Placements stored = gathered;
      if (zero3 && !p->shape.empty()) {  // ZeRO-3; a placement over a mesh dim of one rank splits nothing
        Placements splits = gathered;
        for (size_t d = 0; d < splits.size(); ++d)
          if (mesh.dim_size(static_cast<int64_t>(d)) == 1) splits[d] = Replicate();
        const size_t dp_dim = static_cast<size_t>(layout.stage_dim("dp"));
        stored = layout.placements(
            {{"dp", Shard(dp_shard_dim(splits, dp_dim, p->shape, layout.degree("dp")))}, {"ep", ep}, {"tp", tp}});
      }
      const nn::Init init = p->init;
      const std::string name = p->name;
      Tensor v;
      {
        MemoryKindScope charge(MemoryKind::params);
        v = make_dtensor(p->shape, p->dtype, mesh, stored, [&](const Tensor& local, const GlobalBox& box) {
          nn::init_fill(local, init, seed, name, box);
        });
      }
      v.set_name(p->name);
      v.set_requires_grad(true);
      p->value = v;
      if (stored != gathered)
        p->gather = [mesh, gathered](const Tensor& t) {
          MemoryKindScope charge(MemoryKind::params);  // a gathered weight is parameter bytes
          return reshard(t, mesh, gathered);
        };
      else
        p->gather = nullptr;
    }
    if (!holds) continue;
    if (!m->own_parameters().empty() && m->own_parameters()[0]->file_stack) continue;  // the MoE block moves their inputs
    const Placement seq = sp ? Placement(Shard(1)) : Placement(Replicate());
    const int64_t tp_dim = layout.stage_dim("tp");
    switch (style) {
      case Style::colwise:
        m->input_hook = [tp_dim](const Tensor& x) { return with_tp(x, tp_dim, Replicate()); };
        break;
      case Style::rowwise:
      case Style::vocabwise:
        m->output_hook = [tp_dim, seq](const Tensor& y) { return with_tp(y, tp_dim, seq); };
        break;
      case Style::replicate: break;
    }
  }
  // Mixture-of-experts blocks compute on local pieces, exchanging tokens over ep.
  std::shared_ptr<const nn::ExpertComm> comm;
  for (nn::Module* m : model.modules())
    if (auto* moe = dynamic_cast<nn::MoeBlock*>(m)) {
      if (!comm) comm = expert_comm(layout, mesh);
      moe->comm = comm;
    }
}

}  // namespace tessel::parallel
