// A training step traced on one rank: the engine runs the layout's step (forward, backward,
// optimizer) as that rank would, in meta mode (tensors with shapes and no data, ops inferring
// and costing instead of computing, core/context.h) over a trace world (the other ranks are not
// there; every collective is counted and completes at once, comm/trace_backend.h). What comes
// out is what the runtime does, not a description of it: each op's FLOPs and bytes, each
// collective by group, the memory the allocator would have held. The planner costs layouts from
// it (docs/plan.md, "Traced costs").
#pragma once

#include <string>
#include <vector>

#include "tessel/comm/process_group.h"
#include "tessel/engine/engine.h"
#include "tessel/ops/trace.h"
#include "tessel/plan/planner.h"
#include "tessel/plan/traced.h"

namespace tessel {

struct RankTrace {
  int rank = 0;
  OpTrace ops;                   // the last traced step's compute
  std::vector<GroupStats> groups;  // the last traced step's collectives, by group (those that carried any)
  RankMemory memory;             // the highest marks of the allocator's counters over the traced steps
  CommStats comm() const;        // every group's, summed
};

// Traces `steps` training steps of `config` (its parallel section decides the world) as rank
// `rank`, and returns the last one's compute and communication (the first step makes
// optimizer states and groups; later steps are the steady state). Runs on a thread of its own;
// the config's data is opened as for training.
RankTrace trace_rank_step(const RunConfig& config, int rank, int steps = 2);

// The config of a traced block step for the planner (plan/traced.h): `layers` blocks of `m`
// (gpt: tessel's GPT-2; llama; a mixture of experts' sparse blocks when s.moe, all of them
// sparse), one micro-batch of s.micro_batch sequences per rank, the layout's tp, sp, cp,
// recompute and (sparse blocks) ep, dp = pp = 1, no data file (meta mode makes its tokens up).
RunConfig block_trace_config(const plan::ModelSpec& m, const plan::LayerShape& s, int layers);
// Copies a planned layout into a config's parallel section (and train.micro_batch).
void apply_layout(RunConfig& config, const plan::Layout& layout);

// A traced rank's collectives by the mesh dim whose group (on that rank) has the group's members
// ("world" for the world's own calls, "self" for a group of one).
std::vector<plan::TracedCollective> collectives_by_dim(const RankTrace& t, const parallel::ParallelConfig& config);

// Makes the planner cost layouts from traces of the runtime (plan::set_block_tracer), unless a
// tracer is installed already: `tessel plan`, `--plan auto` and the tests call it.
void install_block_tracer();

}  // namespace tessel
