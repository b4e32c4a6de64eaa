// A hybrid parallel layout: the degrees of a training config's `parallel:` section and the
// meshes they make. The world is a mesh of named dims in the order `parallel.mesh` gives,
// outermost first (default [pp, dp, cp, tp]: tensor parallel innermost, so its ranks are
// neighbours — on one node — and context parallel just outside it, so a sequence split over cp
// and again over tp (sequence parallel) is split cp-major, as the ring needs); each pipeline rank's stage runs on the sub-mesh at its pp coordinate, which
// keeps the other dims in the same order. Code asks for a dim by name (degree("dp"),
// coord("tp"), group("dp"), placements({{"dp", Shard(0)}})), never by position, so a new
// dimension is one more name.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessel/comm/process_group.h"

#include "tessel/sharding/mesh.h"
#include "tessel/sharding/placement.h"

namespace tessel::parallel {

// With ep > 1: how tessel's world differs from Megatron-Core's, whose
// --expert-model-parallel-size divides the data-parallel size instead of standing beside it —
// the world each form makes of `c`'s degrees, and the tessel layout that Megatron's reading
// means. "" when ep is 1.
struct ParallelConfig;
std::string expert_world_note(const ParallelConfig& c);

struct ParallelConfig {
  int64_t dp = 1, tp = 1, pp = 1;
  // Expert parallel: a mixture of experts' experts split over `ep` ranks, which also split the
  // batch (inside data parallel, as Megatron-Core and DeepSpeed place it): dense parameters are
  // replicated over dp · ep ranks, experts over dp.
  int64_t ep = 1;
  // Context parallel (docs/attention.md): the sequence split over `cp` ranks, attention by a
  // ring of key/value blocks ("ring") or by heads after an all_to_all ("all_to_all").
  int64_t cp = 1;
  std::string cp_method = "ring";
  int64_t vpp = 1;             // model chunks per pipeline rank (interleaved schedule)
  int64_t sharding_stage = 0;  // ZeRO: 0 none, 1 optimizer states, 2 + gradients, 3 + parameters
  bool sp = false;             // sequence parallel (needs tp > 1 to matter)
  int64_t micro_batches = 1;
  std::string schedule = "1F1B";   // FThenB | 1F1B | VPP | ZBH1
  std::string recompute = "none";  // none | selective (attention probabilities) | full (per block)
  double bucket_mb = 4;            // gradient bytes per data-parallel collective (MiB)
  std::vector<int64_t> stage_layers;  // blocks per virtual stage (empty: as even as possible)
  // The mesh dims, outermost first: an order of names in kMeshDims. World ranks are numbered
  // row-major over them. pp, dp and tp are always named; ep and cp may be left out.
  std::vector<std::string> mesh = {"pp", "dp", "tp"};
  static constexpr std::string_view kMeshDims[] = {"pp", "dp", "ep", "cp", "tp"};

  int64_t world_size() const { return dp * ep * cp * tp * pp; }
  // "dp 2, tp 2, pp 1" and, where above 1, ep and cp: the degrees that multiply into the world.
  std::string degrees_str() const;
  // The dims the world mesh has: `mesh`, with ep (left out) just inside dp, where the peers put
  // it, and cp (left out) just outside tp — each only when it has more than one rank: a dim of
  // one rank is not in the mesh at all, so layouts without it keep their meshes, placements and
  // the checkpoints they describe.
  std::vector<std::string> full_mesh() const;
  // Checks the context-parallel keys against the model and sequence; throws naming the key.
  void validate_cp(int64_t seq_len, int64_t heads, int64_t kv_heads) const;
  // The degree of the mesh dim called `dim`; throws naming the known dims.
  int64_t degree(std::string_view dim) const;
  // Checks that `mesh` names known dims once and every dim of degree > 1; throws naming parallel.mesh.
  void check_mesh() const;
  // Checks the degrees against the model and batch; throws naming the key (parallel.*).
  void validate(int64_t num_blocks, int64_t global_batch) const;
  std::string str() const;  // "dp2·tp2·pp2 vpp1 stage3 sp 1F1B m4 recompute none"
};

// Which blocks each virtual stage runs: [first, last) per virtual stage (pp · vpp of them).
std::vector<std::pair<int64_t, int64_t>> stage_blocks(const ParallelConfig& c, int64_t num_blocks);

// The tensor dim ZeRO shards over `dp` ranks for a parameter of `shape` whose placement over tp
// is `tp`: the first dim tp does not shard that has at least dp rows (its pieces then lie one
// after another in memory when it is dim 0), else the largest dim tp does not shard, so no rank
// is left with nothing when another dim would do (dim 0 when tp shards the only one).
int64_t dp_shard_dim(const Placement& tp, const Shape& shape, int64_t dp);
// The same for a parameter stored as `stored` on a stage mesh whose dp dim is `dp_dim`: no dim
// another mesh dim shards (so expert weights, split over ep on their expert dim, are split over
// dp on another).
int64_t dp_shard_dim(const Placements& stored, size_t dp_dim, const Shape& shape, int64_t dp);

class Layout {
 public:
  Layout(ParallelConfig config, int64_t world_rank);
  const ParallelConfig& config() const { return config_; }
  const ProcessMesh& world_mesh() const { return world_; }
  // The mesh of pipeline rank `pp` (default: this rank's): the world's dims less pp.
  ProcessMesh stage_mesh(int64_t pp) const;
  ProcessMesh stage_mesh() const { return stage_mesh(coord("pp")); }

  // Whether the world mesh has the dim `dim` (pp, dp and tp always; ep and cp when used).
  bool has_dim(std::string_view dim) const;
  // This rank's coordinate along the mesh dim `dim` (0 along an absent one), and its degree.
  int64_t coord(std::string_view dim) const;
  int64_t degree(std::string_view dim) const { return config_.degree(dim); }
  // The world rank at this rank's coordinates with `dim`'s changed to `index`.
  int64_t peer(std::string_view dim, int64_t index) const;
  // Whether this rank is at coordinate 0 of every dim but those named (the one rank of its
  // group along the named dims that speaks for the others).
  bool first_along_all_but(std::initializer_list<std::string_view> dims) const;
  // The index of `dim` on a stage mesh (a dim other than pp).
  int64_t stage_dim(std::string_view dim) const;
  // Placements on a stage mesh: the given ones on the named dims, Replicate on the others
  // (a named dim the mesh lacks, of one rank, is left out).
  Placements placements(std::initializer_list<std::pair<std::string_view, Placement>> by_dim) const;
  // This rank's process group along the stage mesh dim `dim`.
  std::shared_ptr<ProcessGroup> group(std::string_view dim) const;
  // This rank's group along the world mesh dim `dim` (pp: the ranks of this rank's pipeline,
  // group rank = pp coordinate).
  std::shared_ptr<ProcessGroup> world_group_along(std::string_view dim) const;

  // Placements on a stage mesh: the activations between blocks ([B, T, C]: batch over dp and
  // ep; the sequence over cp, and over tp with sequence parallel) and the token ids ([B, T]:
  // batch over dp and ep, sequence over cp).
  Placements activation_placements() const;
  Placements ids_placements() const;

  int64_t rank = 0;

 private:
  ParallelConfig config_;
  ProcessMesh world_;
  std::vector<int64_t> coord_;  // this rank's coordinates on world_
};

}  // namespace tessel::parallel
