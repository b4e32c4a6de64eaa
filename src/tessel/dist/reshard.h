// The reshard executor: runs a plan (tessel/sharding/reshard_plan.h, where the planner and
// its catalogue of moves live) on this rank's piece, one collective along a mesh dim per step,
// send/recv between meshes.
#pragma once

#include "tessel/core/tensor.h"
#include "tessel/sharding/reshard_plan.h"

namespace tessel {

// Runs `plan` on this rank's piece `local` (of the plan's src) and returns its piece of the
// result (empty on ranks outside the destination mesh). Not recorded by autograd.
Tensor run_reshard(const Tensor& local, const ReshardPlan& plan);

}  // namespace tessel
