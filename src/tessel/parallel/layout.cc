// Hybrid layouts.
#include "tessel/parallel/layout.h"

#include "tessel/core/error.h"
#include "tessel/parallel/schedule.h"

namespace tessel::parallel {

void ParallelConfig::validate(int64_t num_blocks, int64_t global_batch) const {
  for (auto [key, v] : {std::pair{"dp", dp}, {"tp", tp}, {"pp", pp}, {"vpp", vpp}, {"micro_batches", micro_batches}})
    TESSEL_CHECK(v >= 1, "parallel.{} must be at least 1, got {}", key, v);
  TESSEL_CHECK(sharding_stage >= 0 && sharding_stage <= 3, "parallel.sharding_stage must be 0, 1, 2 or 3, got {}",
               sharding_stage);
  TESSEL_CHECK(recompute == "none" || recompute == "full", "parallel.recompute must be none or full, got '{}'", recompute);
  TESSEL_CHECK(global_batch % micro_batches == 0,
               "train.global_batch {} is not a multiple of parallel.micro_batches {}", global_batch, micro_batches);
  const int64_t mb = global_batch / micro_batches;
  TESSEL_CHECK(mb >= dp, "each micro-batch has {} rows (train.global_batch {} / parallel.micro_batches {}) — fewer than "
               "parallel.dp = {}, so some data-parallel ranks would get none",
               mb, global_batch, micro_batches, dp);
  if (vpp > 1) {
    TESSEL_CHECK(pp > 1, "parallel.vpp = {} needs parallel.pp > 1", vpp);
    TESSEL_CHECK(canonical_schedule_name(schedule) == "VPP",
                 "parallel.vpp = {} puts several model chunks on each pipeline rank, which only parallel.schedule VPP "
                 "runs; got {}",
                 vpp, schedule);
    TESSEL_CHECK(micro_batches % pp == 0,
                 "parallel.micro_batches ({}) must be a multiple of parallel.pp ({}) with parallel.vpp = {}: the "
                 "interleaved schedule sends micro-batches through the chunks in groups of pp",
                 micro_batches, pp, vpp);
  }
  const int64_t stages = pp * vpp;
  if (!stage_layers.empty()) {
    TESSEL_CHECK(static_cast<int64_t>(stage_layers.size()) == stages,
                 "parallel.stage_layers has {} entries but pp · vpp = {} virtual stages", stage_layers.size(), stages);
    int64_t total = 0;
    for (int64_t n : stage_layers) {
      TESSEL_CHECK(n >= 1, "parallel.stage_layers: every stage needs at least one block, got {}", n);
      total += n;
    }
    TESSEL_CHECK(total == num_blocks, "parallel.stage_layers adds up to {} blocks but the model has {}", total, num_blocks);
  } else {
    TESSEL_CHECK(num_blocks >= stages, "the model has {} blocks, fewer than pp · vpp = {} virtual stages", num_blocks,
                 stages);
  }
}

std::string ParallelConfig::str() const {
  return fmt::format("dp{}·tp{}·pp{} vpp{} stage{}{} {} m{} recompute {}", dp, tp, pp, vpp, sharding_stage,
                     sp ? " sp" : "", schedule, micro_batches, recompute);
}

std::vector<std::pair<int64_t, int64_t>> stage_blocks(const ParallelConfig& c, int64_t num_blocks) {
  const int64_t stages = c.pp * c.vpp;
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t first = 0;
  for (int64_t s = 0; s < stages; ++s) {
    // Balanced: sizes differ by at most one, larger ones first.
    int64_t n = c.stage_layers.empty() ? num_blocks / stages + (s < num_blocks % stages ? 1 : 0)
                                       : c.stage_layers[static_cast<size_t>(s)];
    out.emplace_back(first, first + n);
    first += n;
  }
  return out;
}

int64_t dp_shard_dim(const Placements& placements, size_t ndim) {
  for (size_t d = 0; d < ndim; ++d)
    if (!placements[1].is_shard(static_cast<int64_t>(d))) return static_cast<int64_t>(d);
  return 0;
}

Layout::Layout(ParallelConfig config, int64_t world_rank) : rank(world_rank), config_(std::move(config)) {
  world_ = ProcessMesh::iota({config_.pp, config_.dp, config_.tp}, {"pp", "dp", "tp"});
  TESSEL_CHECK(world_rank >= 0 && world_rank < world_.size(), "rank {} is outside a layout of {} ranks ({})", world_rank,
               world_.size(), config_.str());
  std::vector<int64_t> c = world_.coord(world_rank);
  pp_rank = c[0];
  dp_rank = c[1];
  tp_rank = c[2];
}

ProcessMesh Layout::stage_mesh(int64_t pp) const { return world_.sub_mesh(0, pp); }

Placements Layout::activation_placements() const { return {Shard(0), config_.sp ? Shard(1) : Replicate()}; }
Placements Layout::ids_placements() const { return {Shard(0), Replicate()}; }

}  // namespace tessel::parallel
