// Hybrid layouts.
#include "tessel/parallel/layout.h"

#include <algorithm>

#include "tessel/core/error.h"
#include "tessel/dist/mesh_comm.h"
#include "tessel/parallel/schedule.h"

namespace tessel::parallel {

int64_t ParallelConfig::degree(std::string_view dim) const {
  if (dim == "pp") return pp;
  if (dim == "dp") return dp;
  if (dim == "tp") return tp;
  if (dim == "ep") return ep;
  if (dim == "cp") return cp;
  TESSEL_THROW("no mesh dim '{}' in a layout (have: {})", dim, fmt::join(kMeshDims, ", "));
}

void ParallelConfig::check_mesh() const {
  // pp, dp and tp are named always; ep and cp may be left out (full_mesh places them).
  for (const char* dim : {"pp", "dp", "tp"})
    TESSEL_CHECK(std::count(mesh.begin(), mesh.end(), dim) == 1,
                 "parallel.mesh must name each of pp, dp and tp once (outermost first), got [{}]; ep and cp may be "
                 "named once too (left out, ep sits just inside dp and cp just outside tp)",
                 fmt::join(mesh, ", "));
  const std::vector<std::string> known(std::begin(kMeshDims), std::end(kMeshDims));
  for (const std::string& dim : mesh) {
    TESSEL_CHECK(std::find(known.begin(), known.end(), dim) != known.end(),
                 "parallel.mesh names '{}', which is not a mesh dim (have: {})", dim, fmt::join(known, ", "));
    TESSEL_CHECK(std::count(mesh.begin(), mesh.end(), dim) == 1, "parallel.mesh names '{}' twice: [{}]", dim,
                 fmt::join(mesh, ", "));
  }
}

std::vector<std::string> ParallelConfig::full_mesh() const {
  std::vector<std::string> out;
  for (const std::string& dim : mesh)
    if ((dim != "ep" || ep > 1) && (dim != "cp" || cp > 1)) out.push_back(dim);
  auto absent = [&](std::string_view dim) { return std::find(out.begin(), out.end(), dim) == out.end(); };
  if (ep > 1 && absent("ep")) {
    auto at = std::find(out.begin(), out.end(), "dp");
    out.insert(at == out.end() ? out.end() : at + 1, "ep");
  }
  if (cp > 1 && absent("cp")) out.insert(std::find(out.begin(), out.end(), "tp"), "cp");
  return out;
}

void ParallelConfig::validate_cp(int64_t seq_len, int64_t heads, int64_t kv_heads) const {
  TESSEL_CHECK(cp >= 1, "parallel.cp must be at least 1, got {}", cp);
  TESSEL_CHECK(cp_method == "ring" || cp_method == "all_to_all", "parallel.cp_method must be ring or all_to_all, got '{}'",
               cp_method);
  if (cp == 1) return;
  if (cp_method == "ring") {
    // Causal load balance: 2·cp chunks, rank r holding chunks r and 2·cp - 1 - r.
    TESSEL_CHECK(seq_len % (2 * cp) == 0,
                 "train.seq_len ({}) must be a multiple of 2 · parallel.cp = {} with parallel.cp_method ring: each cp "
                 "rank holds one chunk from each end of the sequence (causal load balance)",
                 seq_len, 2 * cp);
  } else {
    // Heads are what the all_to_all splits: every cp rank needs whole kv heads of its tp rank's.
    TESSEL_CHECK(kv_heads % (tp * cp) == 0 && heads % (tp * cp) == 0,
                 "parallel.cp_method all_to_all splits the attention heads over tp · cp = {} · {} ranks, so they must "
                 "divide the key/value heads ({}) and the query heads ({}); use parallel.cp_method ring",
                 tp, cp, kv_heads, heads);
    TESSEL_CHECK(seq_len % cp == 0, "train.seq_len ({}) must be a multiple of parallel.cp ({})", seq_len, cp);
  }
}

void ParallelConfig::validate(int64_t num_blocks, int64_t global_batch) const {
  check_mesh();
  for (auto [key, v] : {std::pair{"dp", dp}, {"ep", ep}, {"cp", cp}, {"tp", tp}, {"pp", pp}, {"vpp", vpp},
                        {"micro_batches", micro_batches}})
    TESSEL_CHECK(v >= 1, "parallel.{} must be at least 1, got {}", key, v);
  TESSEL_CHECK(sharding_stage >= 0 && sharding_stage <= 3, "parallel.sharding_stage must be 0, 1, 2 or 3, got {}",
               sharding_stage);
  TESSEL_CHECK(recompute == "none" || recompute == "selective" || recompute == "full",
               "parallel.recompute must be none, selective or full, got '{}'", recompute);
  TESSEL_CHECK(bucket_mb > 0 && bucket_mb <= 4096, "parallel.bucket_mb must be in (0, 4096], got {}", bucket_mb);
  TESSEL_CHECK(global_batch % micro_batches == 0,
               "train.global_batch {} is not a multiple of parallel.micro_batches {}", global_batch, micro_batches);
  const int64_t mb = global_batch / micro_batches;
  TESSEL_CHECK(mb >= dp * ep, "each micro-batch has {} rows (train.global_batch {} / parallel.micro_batches {}) — fewer than "
               "parallel.dp · parallel.ep = {}, so some data-parallel ranks would get none{}",
               mb, global_batch, micro_batches, dp * ep, expert_world_note(*this));
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
  // The mesh order only when it is not the default.
  const std::string order = mesh == ParallelConfig{}.mesh ? "" : fmt::format("mesh [{}] ", fmt::join(mesh, ","));
  // ep and cp only when used, so the layouts without them print as before.
  const std::string experts = ep > 1 ? fmt::format("·ep{}", ep) : "";
  const std::string context = cp > 1 ? fmt::format("·cp{} {}", cp, cp_method) : "";
  return fmt::format("{}dp{}{}·tp{}·pp{}{} vpp{} stage{}{} {} m{} recompute {}", order, dp, experts, tp, pp, context, vpp,
                     sharding_stage, sp ? " sp" : "", schedule, micro_batches, recompute);
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

int64_t dp_shard_dim(const Placement& tp, const Shape& shape, int64_t dp) {
  int64_t largest = -1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (tp.is_shard(static_cast<int64_t>(d))) continue;
    if (shape[d] >= dp) return static_cast<int64_t>(d);
    if (largest < 0 || shape[d] > shape[static_cast<size_t>(largest)]) largest = static_cast<int64_t>(d);
  }
  return largest < 0 ? 0 : largest;
}

int64_t dp_shard_dim(const Placements& stored, size_t dp_dim, const Shape& shape, int64_t dp) {
  int64_t largest = -1;
  for (size_t d = 0; d < shape.size(); ++d) {
    bool taken = false;
    for (size_t m = 0; m < stored.size(); ++m) taken = taken || (m != dp_dim && stored[m].is_shard(static_cast<int64_t>(d)));
    if (taken) continue;
    if (shape[d] >= dp) return static_cast<int64_t>(d);
    if (largest < 0 || shape[d] > shape[static_cast<size_t>(largest)]) largest = static_cast<int64_t>(d);
  }
  return largest < 0 ? 0 : largest;
}

Layout::Layout(ParallelConfig config, int64_t world_rank) : rank(world_rank), config_(std::move(config)) {
  config_.check_mesh();
  Shape shape;
  const std::vector<std::string> names = config_.full_mesh();
  for (const std::string& dim : names) shape.push_back(config_.degree(dim));
  world_ = ProcessMesh::iota(shape, names);
  TESSEL_CHECK(world_rank >= 0 && world_rank < world_.size(), "rank {} is outside a layout of {} ranks ({})", world_rank,
               world_.size(), config_.str());
  coord_ = world_.coord(world_rank);
}

ProcessMesh Layout::stage_mesh(int64_t pp) const { return world_.sub_mesh(world_.dim_index("pp"), pp); }

bool Layout::has_dim(std::string_view dim) const { return world_.find_dim(dim) >= 0; }

int64_t Layout::coord(std::string_view dim) const {
  return has_dim(dim) ? coord_[static_cast<size_t>(world_.dim_index(dim))] : 0;
}

int64_t Layout::peer(std::string_view dim, int64_t index) const {
  std::vector<int64_t> c = coord_;
  c[static_cast<size_t>(world_.dim_index(dim))] = index;
  return world_.rank_at(c);
}

bool Layout::first_along_all_but(std::initializer_list<std::string_view> dims) const {
  for (size_t d = 0; d < coord_.size(); ++d) {
    const std::string& name = world_.dim_names()[d];
    if (std::find(dims.begin(), dims.end(), name) == dims.end() && coord_[d] != 0) return false;
  }
  return true;
}

int64_t Layout::stage_dim(std::string_view dim) const {
  TESSEL_ASSERT(dim != "pp", "pipeline stages have no pp dim");
  const int64_t at = world_.dim_index(dim), pp = world_.dim_index("pp");
  return at < pp ? at : at - 1;
}

Placements Layout::placements(std::initializer_list<std::pair<std::string_view, Placement>> by_dim) const {
  Placements out(static_cast<size_t>(world_.ndim() - 1), Replicate());
  for (const auto& [dim, placement] : by_dim)
    if (has_dim(dim)) out[static_cast<size_t>(stage_dim(dim))] = placement;
  return out;
}

std::shared_ptr<ProcessGroup> Layout::group(std::string_view dim) const {
  return mesh_dim_group(stage_mesh(), stage_dim(dim));
}

std::shared_ptr<ProcessGroup> Layout::world_group_along(std::string_view dim) const {
  return mesh_dim_group(world_, world_.dim_index(dim));
}

// The sequence is placed over cp only when cp > 1, so layouts without context parallelism keep
// their placements (a Shard over a dim of one rank would differ from Replicate only in name).
Placements Layout::activation_placements() const {
  const Placement seq_cp = config_.cp > 1 ? Placement(Shard(1)) : Placement(Replicate());
  return placements({{"dp", Shard(0)}, {"ep", Shard(0)}, {"cp", seq_cp},
                     {"tp", config_.sp ? Placement(Shard(1)) : Placement(Replicate())}});
}
Placements Layout::ids_placements() const {
  return placements({{"dp", Shard(0)}, {"ep", Shard(0)}, {"cp", config_.cp > 1 ? Placement(Shard(1)) : Placement(Replicate())}});
}

std::string ParallelConfig::degrees_str() const {
  std::string out = fmt::format("dp {}", dp);
  if (ep > 1) out += fmt::format(", ep {}", ep);
  if (cp > 1) out += fmt::format(", cp {}", cp);
  return out + fmt::format(", tp {}, pp {}", tp, pp);
}

std::string expert_world_note(const ParallelConfig& c) {
  if (c.ep <= 1) return "";
  const int64_t rest = c.cp * c.tp * c.pp;
  std::string megatron;
  if (c.dp % c.ep == 0)
    megatron = fmt::format("; read as Megatron-Core's, where ep divides the data-parallel size, it is {} ranks: "
                           "tessel's parallel.dp={} parallel.ep={}",
                           c.dp * rest, c.dp / c.ep, c.ep);
  else
    megatron = fmt::format("; in Megatron-Core's form, where ep divides the data-parallel size, dp {} is not a "
                           "multiple of ep {}",
                           c.dp, c.ep);
  return fmt::format(" (in tessel ep stands beside dp: dp {} · ep {} · cp·tp·pp {} = {} ranks{}; docs/moe.md)", c.dp,
                     c.ep, rest, c.world_size(), megatron);
}

}  // namespace tessel::parallel
