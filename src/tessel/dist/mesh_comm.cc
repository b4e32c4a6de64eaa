// Mesh dim groups, cached in the rank context.
#include "tessel/dist/mesh_comm.h"

#include <map>

#include "tessel/comm/world.h"
#include "tessel/core/context.h"
#include "tessel/core/error.h"

namespace tessel {

namespace {
struct MeshGroups {
  std::map<std::string, std::shared_ptr<ProcessGroup>> by_key;
};
}  // namespace

int64_t current_world_rank() { return rank_context().rank; }  // set_world_group keeps it the world rank

std::shared_ptr<ProcessGroup> mesh_dim_group(const ProcessMesh& mesh, int64_t dim) {
  RankContext& ctx = rank_context();
  auto cache = ctx.get_ext<MeshGroups>();
  if (!cache) {
    cache = std::make_shared<MeshGroups>();
    ctx.set_ext(cache);
  }
  std::string key = fmt::format("{}#{}", mesh.str(), dim);
  auto it = cache->by_key.find(key);
  if (it != cache->by_key.end()) return it->second;
  auto world = world_group();
  int64_t me = world->rank();
  TESSEL_CHECK(mesh.contains(me), "mesh {}: rank {} is not in the mesh", mesh.str(), me);
  std::vector<int64_t> members = mesh.group_along(dim, me);
  for (int64_t r : members)
    TESSEL_CHECK(r < world->size(), "mesh {} names rank {} but the world has {} ranks", mesh.str(), r, world->size());
  std::vector<int> set(members.begin(), members.end());
  auto g = world->split({set});
  cache->by_key[key] = g;
  return g;
}

CommStats mesh_comm_stats() {
  CommStats total;
  auto add = [&](const CommStats& s) {
    for (const auto& [op, e] : s.ops) {
      total.ops[op].calls += e.calls;
      total.ops[op].bytes += e.bytes;
    }
  };
  if (has_world_group()) add(world_group()->stats());
  if (auto cache = rank_context().get_ext<MeshGroups>())
    for (const auto& [key, g] : cache->by_key) add(g->stats());
  return total;
}

}  // namespace tessel
