// parallelize: lays a model's parameters out on a stage mesh (dp, tp) by a plan of styles, and
// sets the layout hooks that make tensor and sequence parallelism run through ordinary ops.
//
// A plan maps parameter-name patterns to styles (first match wins; unmatched parameters are
// replicated over tp):
//   ColWise   — a Linear's output features split over tp; its input is made replicated over tp
//               first (PrepareInput: with sequence parallel that is the all_gather of the
//               sequence shards).
//   RowWise   — a Linear's input features split over tp; its output, a Partial sum, is made
//               replicated over tp (all_reduce), or sequence-sharded with sequence parallel
//               (PrepareOutput: reduce_scatter).
//   VocabWise — an Embedding's rows split over tp (vocab parallel); its Partial output is made
//               replicated or sequence-sharded like RowWise's. Used as a tied LM head, the
//               logits come out vocab-sharded and the loss runs on them without gathering.
// Everything else — LayerNorm regions on sequence shards, where the collectives go — follows
// from these placements through the ops' SPMD rules. Over dp, parameters are replicated, or
// with ZeRO stage 3 sharded on their first dim and gathered (a differentiable reshard) just
// before each use.
#pragma once

#include <string>
#include <vector>

#include "tessel/nn/models.h"
#include "tessel/parallel/layout.h"

namespace tessel::parallel {

enum class Style { replicate, colwise, rowwise, vocabwise };

struct PlanRule {
  std::string pattern;  // a parameter's module path with '*' matching one name part ("transformer.h.*.attn.c_attn")
  Style style;
};

struct ParallelPlan {
  std::vector<PlanRule> rules;
  Style style_of(const std::string& module_path) const;
};

// Ready plans (Megatron's layouts): attention and MLP input projections ColWise, output
// projections RowWise, the token embedding VocabWise (GPT-2's head is tied to it; Llama's
// lm_head is ColWise over the vocabulary).
ParallelPlan gpt2_plan();
ParallelPlan llama_plan();
// Llama's, with each expert's w1 and w3 ColWise and w2 RowWise (split within every expert; the
// experts themselves over ep), and the shared expert like an MLP.
ParallelPlan mixtral_plan();
ParallelPlan plan_for(const std::string& arch);

// Creates this rank's pieces of `params` (only those — a model is never materialised whole)
// on `mesh` (the layout's stage mesh) from `seed`, sets the layout hooks of the modules of `model` that
// hold them, and returns the parameters' placements by name.
void parallelize(nn::LanguageModel& model, const std::vector<nn::Parameter*>& params, const ProcessMesh& mesh,
                 const ParallelPlan& plan, const Layout& layout, uint64_t seed);

// The placement a plan gives a parameter over tp (a Linear's weight, or its bias when `bias`;
// ColWise shards the last output dim). Over dp it is replicated, or with ZeRO stage 3 sharded on
// dp_shard_dim.
Placement tp_placement(const nn::Parameter& p, Style style, bool in_out_layout, bool bias = false);

}  // namespace tessel::parallel
