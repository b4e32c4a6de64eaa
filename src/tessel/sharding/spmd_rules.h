// Building blocks for SPMD rules. Most ops are described by labels — one letter per tensor dim
// naming the loop index it runs over, as in einsum notation — and the engine gives each mesh
// dim one strategy:
//   replicate everything; shard one label (inputs with it shard that dim, the others stay
//   replicated; the output shards the label's dim, or is Partial when the label is
//   contracted); or, for ops linear in their inputs, keep Partial inputs Partial (for ops
//   linear in each input separately, one Partial input kept, the others reduced).
// A layout is one strategy per mesh dim, and layouts are priced as a whole: the reshard
// planner's cost of moving every input there (all mesh dims together, so nested shards and
// the moves they forbid are counted) plus the reductions a Partial output still owes
// (owed_reduction_cost). The cheapest wins; ties go to fewer changed input placements, then
// to the layout enumerated first (Partial, then shards, then replicate on each mesh dim).
// docs/dist.md describes the search and its pruning.
#pragma once

#include <string>
#include <vector>

#include "tessel/sharding/spmd.h"

namespace tessel::spmd {

// Estimated bytes one rank moves to bring a tensor of `meta` from `from` to `to` along a mesh
// dim of `k` ranks (ring volumes: all_gather and reduce_scatter (k-1)/k of the data, all_reduce
// twice that, all_to_all (k-1)/k of the local piece); local moves cost nothing.
double transition_cost(const TensorMeta& meta, const Placement& from, const Placement& to, int64_t k);
// The same for a tensor of `bytes` (what the reshard planner's inner loop calls).
double transition_cost(double bytes, const Placement& from, const Placement& to, int64_t k);

// What a Partial output still owes, as rules price it: half the reshard planner's cost of
// reducing `out` to no Partial (the reduce_scatter part; the all_gather part a sharded output
// owes as much).
double owed_reduction_cost(const ProcessMesh& mesh, const Placements& out, const TensorMeta& meta);

// Which inputs may stay Partial together when the op is linear.
enum class Linearity {
  none,    // nonlinear: Partial inputs are reduced first
  joint,   // every input Partial together (add, sub): sum of sums
  single,  // one input Partial, the others replicated (mul, matmul, reductions, unary linear ops);
           // with several Partial inputs one is kept and the others reduced
  first,   // only input 0 Partial (div)
};

struct LabelRule {
  std::vector<std::string> inputs;  // labels per covered input; '.' = a dim that is never sharded
  std::string output;               // labels of the (single) output
  Linearity linearity = Linearity::none;
  ReduceOp contracted = ReduceOp::sum;  // Partial kind of an output whose sharded label was contracted
  // What a Partial output owes, as a multiple of owed_reduction_cost: 1 for a reduction left
  // to the consumer; more where the dist layer settles it itself (argmax merges with two
  // all_reduces, 4 halves). Not negative: the search skips what a candidate's output owes once
  // its inputs alone cost more than the best.
  double owed_scale = 1.0;
  // The output's global shape where a '.' dim is not input 0's at that place (topk's k); empty:
  // as the labels tell.
  Shape output_shape;
};

// Decides placements for inputs [0, rule.inputs.size()) and one output. Further inputs of the
// call (index tensors, masks handled elsewhere) are not touched: callers fill them in.
SpmdDecision label_rule(const SpmdCall& c, const LabelRule& rule);

// Labels for elementwise ops over inputs [0, n) with numpy broadcasting; size-1 output dims
// and broadcast input dims get '.'.
LabelRule elementwise_labels(const SpmdCall& c, size_t n, Linearity linearity);
// Elementwise over every input of the call.
SpmdDecision elementwise_rule(const SpmdCall& c, Linearity linearity);

// One input of rank r, output of the same shape, with `fixed` dims (normalised) never sharded
// (a softmax or normalisation dim). Inputs after the first (weights) must be replicated.
// n consecutive labels from `first`: dim_labels(3) is "abc".
std::string dim_labels(size_t n, char first = 'a');

SpmdDecision keep_shape_rule(const SpmdCall& c, const std::vector<int64_t>& fixed, Linearity linearity);

// Reduction of input 0 over `dims` (normalised): a sharded reduced dim makes the output
// Partial(`partial`); kept dims keep their shards.
// A reduction's output shape with keepdim: `input` with each reduced dim (normalised) 1. A
// rule's '.' output dim is otherwise taken as input 0's, which prices a kept reduced dim's
// Partial output at the whole input's bytes.
Shape keepdim_shape(const Shape& input, const std::vector<int64_t>& dims);
SpmdDecision reduction_rule(const SpmdCall& c, const std::vector<int64_t>& dims, bool keepdim, ReduceOp partial);

// Input i replicated everywhere.
Placements replicated(const SpmdCall& c);
// Placements with every shard of tensor dims in `dims` and every Partial replaced by R.
Placements without(const Placements& p, const std::vector<int64_t>& dims, bool drop_partial = true);
// "S(0),R on mesh(dp=2)" — the inputs' placements, for error messages.
std::string inputs_str(const SpmdCall& c);

}  // namespace tessel::spmd
