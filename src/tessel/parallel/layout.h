// A hybrid parallel layout: the degrees of a training config's `parallel:` section and the
// meshes they make. The world is a mesh [pp, dp, tp] (tensor parallel innermost, so its ranks
// are neighbours — on one node); each pipeline rank's stage runs on the sub-mesh [dp, tp] at
// its pp coordinate.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/sharding/mesh.h"
#include "tessel/sharding/placement.h"

namespace tessel::parallel {

struct ParallelConfig {
  int64_t dp = 1, tp = 1, pp = 1;
  int64_t vpp = 1;             // model chunks per pipeline rank (interleaved schedule)
  int64_t sharding_stage = 0;  // ZeRO: 0 none, 1 optimizer states, 2 + gradients, 3 + parameters
  bool sp = false;             // sequence parallel (needs tp > 1 to matter)
  int64_t micro_batches = 1;
  std::string schedule = "1F1B";   // FThenB | 1F1B | VPP | ZBH1
  std::string recompute = "none";  // none | full (per transformer block)
  std::vector<int64_t> stage_layers;  // blocks per virtual stage (empty: as even as possible)

  int64_t world_size() const { return dp * tp * pp; }
  // Checks the degrees against the model and batch; throws naming the key (parallel.*).
  void validate(int64_t num_blocks, int64_t global_batch) const;
  std::string str() const;  // "dp2·tp2·pp2 vpp1 stage3 sp 1F1B m4 recompute none"
};

// Which blocks each virtual stage runs: [first, last) per virtual stage (pp · vpp of them).
std::vector<std::pair<int64_t, int64_t>> stage_blocks(const ParallelConfig& c, int64_t num_blocks);

// The tensor dim ZeRO shards over dp for a parameter of `ndim` dims laid out `placements` on
// [dp, tp]: the first dim tp does not shard (dim 0 when tp shards the only one).
int64_t dp_shard_dim(const Placements& placements, size_t ndim);

class Layout {
 public:
  Layout(ParallelConfig config, int64_t world_rank);
  const ParallelConfig& config() const { return config_; }
  const ProcessMesh& world_mesh() const { return world_; }
  // The [dp, tp] mesh of pipeline rank `pp` (default: this rank's).
  ProcessMesh stage_mesh(int64_t pp) const;
  ProcessMesh stage_mesh() const { return stage_mesh(pp_rank); }
  int64_t world_rank(int64_t pp, int64_t dp, int64_t tp) const { return (pp * config_.dp + dp) * config_.tp + tp; }

  // Placements on a stage mesh: the activations between blocks ([B, T, C]: batch over dp; the
  // sequence over tp with sequence parallel) and the token ids ([B, T]).
  Placements activation_placements() const;
  Placements ids_placements() const;

  int64_t rank = 0, pp_rank = 0, dp_rank = 0, tp_rank = 0;

 private:
  ParallelConfig config_;
  ProcessMesh world_;
};

}  // namespace tessel::parallel
