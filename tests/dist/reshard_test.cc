// Reshard: every pair of placement lists on 1-D meshes of 3 and 4 ranks and on a 2x2 mesh,
// on shapes that split unevenly (and into empty pieces), plus moves between meshes — the
// result is right, the collectives actually issued (counted through the comm layer by kind
// and bytes) are the plan's, and the plan is the minimum for its transition.
#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "tessel/comm/thread_backend.h"
#include "tessel/comm/world.h"
#include "tessel/core/context.h"
#include "tessel/core/philox.h"
#include "tessel/dist/dtensor.h"
#include "tessel/dist/mesh_comm.h"
#include "tessel/dist/reshard.h"
#include "validator.h"

namespace tessel {
namespace {

Tensor values(const Shape& s) {
  Tensor t = Tensor::empty(s, DType::f64);
  rng_fill(t, Distribution::uniform, -1, 1, 3, 4);
  return t;
}

using Counts = std::map<std::string, std::pair<int64_t, int64_t>>;  // op -> (calls, bytes)

// What this rank issued on the mesh's dim groups and the world group since the last reset.
Counts issued(const ProcessMesh& mesh, bool reset) {
  Counts c;
  std::vector<std::shared_ptr<ProcessGroup>> groups{world_group()};
  if (mesh.contains(world_group()->rank()))
    for (int64_t m = 0; m < mesh.ndim(); ++m) groups.push_back(mesh_dim_group(mesh, m));
  for (auto& g : groups) {
    for (const auto& [op, e] : g->stats().ops) {
      if (op == "barrier") continue;
      c[op].first += e.calls;
      c[op].second += e.bytes;
    }
    if (reset) g->reset_stats();
  }
  return c;
}

Counts planned(const ReshardPlan& plan, int64_t rank) {
  Counts c;
  for (const ReshardStep& s : plan.steps) {
    if (!s.communicates()) continue;
    auto it = s.bytes.find(rank);
    if (s.kind == ReshardStep::Kind::send_recv) continue;  // counted per message below
    if (it == s.bytes.end()) continue;
    int64_t k = (s.dst_mesh ? plan.dst.mesh : plan.src.mesh).dim_size(s.mesh_dim);
    if (k == 1) continue;  // a group of one issues nothing
    c[s.name()].first += 1;
    c[s.name()].second += it->second;
  }
  return c;
}

// The fewest collectives a one-mesh-dim transition can take.
int minimum_collectives(const Placement& a, const Placement& b) {
  if (a == b || a.is_replicate() || b.is_partial()) return 0;  // local slice / zero / pad
  return 1;                                                    // gather, all_to_all, all_reduce, reduce_scatter
}

void check_mesh(const Shape& mesh_shape, const Shape& shape) {
  ProcessMesh mesh = ProcessMesh::iota(mesh_shape);
  Tensor full = values(shape);
  std::vector<Placements> lists = testing::placement_lists(static_cast<int64_t>(shape.size()), /*floating=*/true, mesh.ndim());
  std::vector<std::string> failures;
  std::mutex m;
  int checked = 0;
  spawn(static_cast<int>(mesh.size()), [&](int rank) {
    for (const Placements& src : lists)
      for (const Placements& dst : lists) {
        std::string what = fmt::format("{} {} -> {} on {}", shape_str(shape), placements_str(src), placements_str(dst), mesh.str());
        std::string problem;
        try {
          NoGradGuard g;
          Tensor d = shard_tensor(full, mesh, src);
          issued(mesh, true);
          Tensor r = reshard(d, mesh, dst);
          Counts got = issued(mesh, true);
          ReshardPlan plan = plan_reshard(DistAttr(mesh, src), DistAttr(mesh, dst), shape, DType::f64);
          Counts want = planned(plan, rank);
          if (got != want) problem = fmt::format("issued collectives differ from the plan:\n{}", plan.str());
          if (mesh.ndim() == 1) {
            int n = 0;
            for (const ReshardStep& s : plan.steps) n += s.communicates() ? 1 : 0;
            if (n != minimum_collectives(src[0], dst[0]))
              problem = fmt::format("{} collectives, the minimum is {}:\n{}", n, minimum_collectives(src[0], dst[0]), plan.str());
          } else {
            int n = 0, changed = 0;
            for (const ReshardStep& s : plan.steps) n += s.communicates() ? 1 : 0;
            for (size_t k = 0; k < src.size(); ++k) changed += minimum_collectives(src[k], dst[k]);
            if (n > changed + 1) problem = fmt::format("{} collectives for {} changed mesh dims:\n{}", n, changed, plan.str());
          }
          std::vector<double> back = full_tensor(r).to_doubles(), want_v = full.to_doubles();
          for (size_t i = 0; i < back.size() && problem.empty(); ++i)
            if (std::abs(back[i] - want_v[i]) > 1e-12) problem = fmt::format("value {} is {} not {}", i, back[i], want_v[i]);
        } catch (const std::exception& e) {
          problem = fmt::format("error: {}", e.what());
        }
        if (!problem.empty()) {
          std::lock_guard lock(m);
          failures.push_back(fmt::format("rank {}: {}: {}", rank, what, problem));
        }
        if (rank == 0) ++checked;
      }
  });
  for (size_t i = 0; i < failures.size() && i < 20; ++i) ADD_FAILURE() << failures[i];
  EXPECT_EQ(checked, static_cast<int>(lists.size() * lists.size()));
}

TEST(Reshard, AllPairsOnThreeRanks) { check_mesh({3}, {7, 5}); }
TEST(Reshard, AllPairsOnFourRanks) { check_mesh({4}, {6, 3}); }
TEST(Reshard, AllPairsOnTwoByTwo) { check_mesh({2, 2}, {5, 3}); }
TEST(Reshard, AllPairsThreeDims) { check_mesh({2}, {3, 1, 4}); }
// A leading dim of 1 (a micro-batch of one sequence): gathers and reduce-scatters along dim 1
// then work on the collective's buffer in place, as they do along dim 0.
TEST(Reshard, AllPairsWithALeadingDimOfOne) { check_mesh({3}, {1, 7, 2}); }

TEST(Reshard, KnownOneStepTransitions) {
  ProcessMesh mesh = ProcessMesh::iota({4});
  auto one = [&](Placement a, Placement b, ReshardStep::Kind kind) {
    ReshardPlan p = plan_reshard(DistAttr(mesh, {a}), DistAttr(mesh, {b}), {8, 6}, DType::f32);
    ASSERT_EQ(p.steps.size(), 1u) << p.str();
    EXPECT_EQ(p.steps[0].kind, kind) << p.str();
  };
  one(Shard(0), Shard(1), ReshardStep::Kind::all_to_all);
  one(Partial(), Shard(0), ReshardStep::Kind::reduce_scatter);
  one(Replicate(), Shard(1), ReshardStep::Kind::slice);
  one(Partial(), Replicate(), ReshardStep::Kind::all_reduce);
  one(Shard(1), Replicate(), ReshardStep::Kind::all_gather);
  // Bytes each rank hands over: all_gather of an [8, 6] f32 sharded 4 ways: 2 rows each.
  ReshardPlan g = plan_reshard(DistAttr(mesh, {Shard(0)}), DistAttr(mesh, {Replicate()}), {8, 6}, DType::f32);
  EXPECT_EQ(g.steps[0].bytes.at(2), 2 * 6 * 4);
  EXPECT_NE(g.str().find("all_gather"), std::string::npos);
}

// Between meshes: disjoint, overlapping, and of different shapes, with Partial ends.
TEST(Reshard, AcrossMeshes) {
  struct Case {
    const char* src;
    const char* dst;
  };
  const Case cases[] = {
      {"mesh(a=2)[0,1][S(0)]", "mesh(b=2)[2,3][S(1)]"},
      {"mesh(a=2)[0,1][P(sum)]", "mesh(b=2)[2,3][R]"},
      {"mesh(a=3)[0,1,2][S(1)]", "mesh(b=3)[1,2,3][S(0)]"},
      {"mesh(x=2,y=2)[[0,1],[2,3]][S(0),S(1)]", "mesh(z=4)[3,2,1,0][S(1)]"},
      {"mesh(z=4)[0,1,2,3][R]", "mesh(x=2,y=2)[[0,1],[2,3]][P(sum),S(0)]"},
      {"mesh(a=1)[3][R]", "mesh(b=3)[0,1,2][S(0)]"},
      {"mesh(x=2,y=2)[[0,1],[2,3]][S(0),P(sum)]", "mesh(pp=2)[0,1][S(1)]"},
      {"mesh(x=2,y=2)[[0,1],[2,3]][S(0),R]", "mesh(c=2)[3,2][S(1)]"},
      {"mesh(x=2,y=2)[[0,1],[2,3]][P(sum),P(sum)]", "mesh(z=4)[0,1,2,3][R]"},
  };
  Tensor full = values({7, 5});
  std::vector<double> want = full.to_doubles();
  for (const Case& c : cases) {
    DistAttr src = DistAttr::parse(c.src), dst = DistAttr::parse(c.dst);
    ReshardPlan plan = plan_reshard(src, dst, {7, 5}, DType::f64);
    std::mutex m;
    std::vector<std::string> failures;
    spawn(4, [&](int rank) {
      try {
        NoGradGuard g;
        Tensor d = shard_tensor(full, src.mesh, src.placements);
        world_group()->reset_stats();
        Tensor r = reshard(d, dst.mesh, dst.placements);
        CommStats s = world_group()->stats();
        auto it = s.ops.find("send");
        int64_t sent = it == s.ops.end() ? 0 : it->second.bytes;
        int64_t planned_sent = 0;
        for (const ReshardStep& st : plan.steps)
          if (st.kind == ReshardStep::Kind::send_recv && st.bytes.count(rank)) planned_sent += st.bytes.at(rank);
        if (sent != planned_sent) throw Error(fmt::format("rank {} sent {} B, the plan says {}", rank, sent, planned_sent));
        if (dst.mesh.contains(rank)) {
          std::vector<double> got = full_tensor(r).to_doubles();
          for (size_t i = 0; i < got.size(); ++i)
            if (std::abs(got[i] - want[i]) > 1e-12) throw Error(fmt::format("rank {} value {} is {} not {}", rank, i, got[i], want[i]));
        }
      } catch (const std::exception& e) {
        std::lock_guard lock(m);
        failures.push_back(fmt::format("{} -> {}: {}\n{}", c.src, c.dst, e.what(), plan.str()));
      }
    });
    for (const std::string& f : failures) ADD_FAILURE() << f;
  }
}

// Between meshes the pieces leave from the cheapest layout without Partial, not always from
// the one that only drops Partial: a Partial is reduce-scattered rather than all-reduced, and
// a replicated dim is sliced so that every replica sends a part.
TEST(Reshard, AcrossMeshesSendsFromTheCheapestLayout) {
  auto plan = [](const char* src, const char* dst, const Shape& shape) {
    return plan_reshard(DistAttr::parse(src), DistAttr::parse(dst), shape, DType::f32);
  };
  auto kinds = [](const ReshardPlan& p) {
    std::vector<std::string> out;
    for (const ReshardStep& s : p.steps) out.push_back(s.name());
    return out;
  };
  // All-reduce [8, 7] (4 x 7 x 4 = 112 B per rank) then send: 224 B for the busiest rank.
  ReshardPlan p = plan("mesh(x=2,y=2)[[0,1],[2,3]][S(0),P(sum)]", "mesh(pp=2)[0,1][S(1)]", {8, 7});
  EXPECT_EQ(kinds(p), (std::vector<std::string>{"reduce_scatter", "send_recv"})) << p.str();
  EXPECT_LT(p.max_bytes(), 224) << p.str();
  // Two replicas of each row block: both send half (64 B) instead of one sending all (128 B).
  p = plan("mesh(x=2,y=2)[[0,1],[2,3]][S(0),R]", "mesh(z=4)[4,5,6,7][S(1)]", {8, 8});
  EXPECT_EQ(kinds(p), (std::vector<std::string>{"slice", "send_recv"})) << p.str();
  for (int64_t r = 0; r < 4; ++r) EXPECT_EQ(p.bytes_for(r), 64) << "rank " << r << "\n" << p.str();
  // Nothing to gain: a sharded source goes as it is.
  p = plan("mesh(a=2)[0,1][S(0)]", "mesh(b=2)[2,3][S(1)]", {7, 5});
  EXPECT_EQ(kinds(p), (std::vector<std::string>{"send_recv"})) << p.str();
}

}  // namespace
}  // namespace tessel
