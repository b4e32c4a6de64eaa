// shard_dataloader: each data-parallel rank reads only its rows of the global batch. The global
// batch of step k is the same for every layout (the sampler's); micro-batch m is its rows
// [m·mb, (m+1)·mb), and data-parallel rank d reads its balanced slice of those rows — so a
// micro-batch is one distributed tensor [mb, S], batch-sharded over dp.
#pragma once

#include <memory>
#include <vector>

#include "tessel/data/dataset.h"
#include "tessel/data/loader.h"
#include "tessel/parallel/layout.h"

namespace tessel::parallel {

struct MicroBatch {
  Tensor inputs, targets;  // distributed [mb, S] on the stage mesh, or undefined when not needed
  int64_t first_row = 0;   // the micro-batch's first row in the global batch
};

class ShardedLoader {
 public:
  // want_inputs / want_targets: whether this rank's stages need them (first / last stage).
  ShardedLoader(std::shared_ptr<const TokenDataset> data, Sampler sampler, const Layout& layout, int64_t global_batch,
                bool want_inputs, bool want_targets);
  std::vector<MicroBatch> batch(int64_t step) const;

 private:
  std::shared_ptr<const TokenDataset> data_;
  Sampler sampler_;
  const Layout& layout_;
  int64_t global_batch_;
  bool want_inputs_, want_targets_;
};

}  // namespace tessel::parallel
