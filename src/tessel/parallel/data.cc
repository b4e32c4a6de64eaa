// Sharded data loading.
#include "tessel/parallel/data.h"

#include "tessel/core/shape.h"
#include "tessel/dist/dtensor.h"

namespace tessel::parallel {

ShardedLoader::ShardedLoader(std::shared_ptr<const TokenDataset> data, Sampler sampler, const Layout& layout,
                             int64_t global_batch, bool want_inputs, bool want_targets)
    : data_(std::move(data)),
      sampler_(std::move(sampler)),
      layout_(layout),
      global_batch_(global_batch),
      want_inputs_(want_inputs),
      want_targets_(want_targets) {}

std::vector<MicroBatch> ShardedLoader::batch(int64_t step) const {
  const ParallelConfig& c = layout_.config();
  const int64_t M = c.micro_batches, mb = global_batch_ / M;
  const ProcessMesh mesh = layout_.stage_mesh();
  std::vector<MicroBatch> out(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) {
    MicroBatch& b = out[static_cast<size_t>(m)];
    b.first_row = m * mb;
    if (!want_inputs_ && !want_targets_) continue;
    // This rank's rows: the batch split over dp and ep as the ids' placements say.
    const DistAttr rows_of(mesh, layout_.ids_placements());
    const int64_t offset = rows_of.local_offset({mb, 1}, layout_.rank)[0], rows = rows_of.local_shape({mb, 1}, layout_.rank)[0];
    Batch local = make_batch(*data_, sampler_, step, m * mb + offset, rows);
    const Shape global{mb, local.inputs.size(1)};
    if (want_inputs_) b.inputs = dtensor_from_local(local.inputs, mesh, layout_.ids_placements(), global);
    if (want_targets_) b.targets = dtensor_from_local(local.targets, mesh, layout_.ids_placements(), global);
  }
  return out;
}

}  // namespace tessel::parallel
