// Sharded data loading.
#include "tessel/parallel/data.h"

#include "tessel/core/context.h"

#include <numeric>

#include "tessel/core/shape.h"
#include "tessel/core/view.h"
#include "tessel/data/loader.h"
#include "tessel/dist/dtensor.h"
#include "tessel/sharding/ring_order.h"

namespace tessel::parallel {

std::vector<int64_t> cp_order(int64_t seq, int64_t cp, const std::string& method) {
  std::vector<int64_t> out(static_cast<size_t>(seq));
  std::iota(out.begin(), out.end(), 0);
  if (cp <= 1 || method != "ring") return out;
  TESSEL_CHECK(seq % (2 * cp) == 0, "ring attention over parallel.cp = {} ranks needs train.seq_len ({}) to be a "
               "multiple of {}", cp, seq, 2 * cp);
  const int64_t c = seq / (2 * cp);
  size_t at = 0;
  for (int64_t r = 0; r < cp; ++r)
    for (int64_t half : {0, 1})
      for (int64_t i = 0; i < c; ++i) out[at++] = ring_chunk(r, cp, half) * c + i;
  return out;
}

Tensor take_columns(const Tensor& x, const std::vector<int64_t>& cols) {
  const Tensor src = view::contiguous(x);
  const int64_t rows = src.size(0), S = src.size(1), n = static_cast<int64_t>(cols.size());
  TESSEL_ASSERT(src.dtype() == DType::i64, "take_columns: token ids are i64");
  DeviceScope on(x.device());
  if (meta_mode()) return Tensor::empty({rows, n}, src.dtype());  // a traced step: the shape is what counts
  // Host work on a host copy of the ids, placed back on their device.
  const std::vector<int64_t> ps = src.to_vector<int64_t>();
  std::vector<int64_t> po(static_cast<size_t>(rows * n));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) po[r * n + j] = ps[r * S + cols[static_cast<size_t>(j)]];
  return Tensor::from_vector(po, {rows, n});
}

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
  const int64_t S = sampler_.seq_len(), cp = layout_.degree("cp");
  // This rank's rows: the batch split over dp and ep as the ids' placements say.
  const DistAttr rows_of(mesh, layout_.placements({{"dp", Shard(0)}, {"ep", Shard(0)}}));
  const int64_t offset = rows_of.local_offset({mb, 1}, layout_.rank)[0], rows = rows_of.local_shape({mb, 1}, layout_.rank)[0];
  const Shape global{mb, S};
  // This cp rank's tokens: its piece of the sequence in the order attention holds it.
  std::vector<int64_t> cols;
  Tensor positions;  // every stage's (Llama's blocks rotate by them), when out of order
  if (cp > 1) {
    const std::vector<int64_t> order = cp_order(S, cp, c.cp_method);
    const int64_t at_cp = layout_.coord("cp");
    const auto first = order.begin() + split_offset(S, cp, at_cp);
    cols.assign(first, first + split_size(S, cp, at_cp));
    if (c.cp_method == "ring") {
      std::vector<int64_t> rows_of_cols;
      if (!meta_mode())
        for (int64_t r = 0; r < rows; ++r) rows_of_cols.insert(rows_of_cols.end(), cols.begin(), cols.end());
      const Shape shape{rows, static_cast<int64_t>(cols.size())};
      Tensor pos = meta_mode() ? Tensor::empty(shape, DType::i64) : Tensor::from_vector(rows_of_cols, shape);
      positions = dtensor_from_local(pos, mesh, layout_.ids_placements(), global);
    }
  }
  for (int64_t m = 0; m < M; ++m) {
    MicroBatch& b = out[static_cast<size_t>(m)];
    b.first_row = m * mb;
    b.positions = positions;
    // Packed documents: every stage's attention needs the document starts (and Llama's blocks
    // the positions), so every stage reads the tokens.
    if (!want_inputs_ && !want_targets_ && eot_ < 0) continue;
    Batch local = make_batch(*data_, sampler_, step, m * mb + offset, rows);
    if (eot_ >= 0) {
      PackedDocuments packed = pack_documents(local.inputs, eot_);
      b.doc_starts = dtensor_from_local(packed.doc_starts, mesh, layout_.placements({{"dp", Shard(0)}, {"ep", Shard(0)}}), global);
      if (cp > 1) packed.positions = take_columns(packed.positions, cols);
      b.positions = dtensor_from_local(packed.positions, mesh, layout_.ids_placements(), global);
    }
    if (cp > 1) {
      local.inputs = take_columns(local.inputs, cols);
      local.targets = take_columns(local.targets, cols);
    }
    if (want_inputs_) b.inputs = dtensor_from_local(local.inputs, mesh, layout_.ids_placements(), global);
    if (want_targets_) b.targets = dtensor_from_local(local.targets, mesh, layout_.ids_placements(), global);
  }
  return out;
}

}  // namespace tessel::parallel
