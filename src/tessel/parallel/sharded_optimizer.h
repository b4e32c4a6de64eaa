// shard_optimizer: AdamW or SGD over distributed parameters, with ZeRO sharding over the
// data-parallel group (Rajbhandari et al. 2020):
//   stage 0 — gradients all-reduced over dp; every dp rank keeps the whole optimizer state.
//   stage 1 — gradients reduce-scattered; each dp rank keeps the state of, and updates, a flat
//             1/dp slice of its parameter piece, then the slices are all-gathered.
//   stage 2 — as 1, and each rank keeps only its gradient slice.
//   stage 3 — parameters are stored sharded over dp (parallelize gathers them just before use;
//             the gather's backward reduce-scatters their gradients), so each rank updates its
//             shard alone.
// Over tp (and across pipeline stages for a tied parameter) gradients are first made to match
// their parameter's layout. Global-norm clipping counts every element once across all shards,
// replicas and stages (torch.nn.utils.clip_grad_norm_ semantics). Gradients travel packed, one
// collective for many parameters (docs/parallel.md, "Gradient buckets").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessel/comm/process_group.h"
#include "tessel/nn/module.h"
#include "tessel/optim/optimizer.h"
#include "tessel/parallel/layout.h"

namespace tessel::parallel {

struct OptimizerOptions {
  std::string kind = "adamw";  // adamw | sgd
  optim::AdamWOptions adamw;
  optim::SgdOptions sgd;
};

// Bytes this rank holds for the persistent training state.
struct StateBytes {
  int64_t params = 0, grads = 0, optimizer = 0;
};

class ShardedOptimizer {
 public:
  // `tied`: parameters this rank shares with another pipeline rank (GPT-2's token embedding,
  // used by the first and the last stage), whose gradients are summed over `tied_group`;
  // `count_tied` says whether this rank's copy counts for the gradient norm.
  ShardedOptimizer(std::vector<nn::Parameter*> params, const Layout& layout, OptimizerOptions options,
                   std::vector<nn::Parameter*> tied = {}, std::shared_ptr<ProcessGroup> tied_group = nullptr,
                   bool count_tied = true);

  // Reduces the gradients as the stage says, clips to `max_norm` (≤ 0: no clipping), updates
  // every parameter with learning rate `lr`, and drops the gradients. Returns the global
  // gradient norm (before clipping).
  double step(double lr, double max_norm);
  // Persistent bytes after a step: parameter pieces, kept gradients, optimizer states.
  StateBytes state_bytes() const;

 private:
  struct Slot;
  std::vector<Slot> slots_;
  const Layout& layout_;
  OptimizerOptions options_;
  std::shared_ptr<ProcessGroup> tied_group_;
  bool count_tied_;
  int64_t steps_ = 0;
  int64_t grad_bytes_ = 0;

 public:
  ~ShardedOptimizer();
};

}  // namespace tessel::parallel
