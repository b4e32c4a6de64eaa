// Layout: mesh dims are found by name, whatever order parallel.mesh declares them in.
#include <gtest/gtest.h>

#include <set>

#include "tessel/core/error.h"
#include "tessel/parallel/layout.h"

namespace tessel::parallel {
namespace {

ParallelConfig config_with(std::vector<std::string> order) {
  ParallelConfig c;
  c.pp = 2;
  c.dp = 3;
  c.tp = 2;
  c.mesh = std::move(order);
  return c;
}

TEST(Layout, FindsEveryDimByNameInAnyOrder) {
  for (std::vector<std::string> order : {std::vector<std::string>{"pp", "dp", "tp"}, {"tp", "pp", "dp"}, {"dp", "tp", "pp"}}) {
    const ParallelConfig c = config_with(order);
    SCOPED_TRACE(c.str());
    std::set<std::vector<int64_t>> seen;  // (pp, dp, tp) of every rank
    for (int64_t r = 0; r < c.world_size(); ++r) {
      const Layout l(c, r);
      const std::vector<int64_t> at{l.coord("pp"), l.coord("dp"), l.coord("tp")};
      EXPECT_LT(at[0], 2);
      EXPECT_LT(at[1], 3);
      EXPECT_LT(at[2], 2);
      seen.insert(at);
      // The world mesh's coordinates are the named ones, in the declared order.
      const std::vector<int64_t> world = l.world_mesh().coord(r);
      for (size_t d = 0; d < order.size(); ++d) EXPECT_EQ(world[d], l.coord(order[d])) << order[d];
      // A peer along one dim differs only there.
      const Layout other(c, l.peer("pp", 1 - at[0]));
      EXPECT_EQ(other.coord("pp"), 1 - at[0]);
      EXPECT_EQ(other.coord("dp"), at[1]);
      EXPECT_EQ(other.coord("tp"), at[2]);
      // The stage mesh holds the ranks of this pipeline coordinate, its dims named as declared.
      const ProcessMesh stage = l.stage_mesh();
      EXPECT_EQ(stage.size(), 6);
      EXPECT_EQ(stage.dim_size(l.stage_dim("dp")), 3);
      EXPECT_EQ(stage.dim_size(l.stage_dim("tp")), 2);
      EXPECT_EQ(stage.dim_names()[static_cast<size_t>(l.stage_dim("tp"))], "tp");
      EXPECT_EQ(stage.coord(r)[static_cast<size_t>(l.stage_dim("dp"))], at[1]);
      const Placements p = l.placements({{"dp", Shard(0)}});
      EXPECT_EQ(p[static_cast<size_t>(l.stage_dim("dp"))], Placement(Shard(0)));
      EXPECT_EQ(p[static_cast<size_t>(l.stage_dim("tp"))], Placement(Replicate()));
      EXPECT_EQ(l.first_along_all_but({"pp"}), at[1] == 0 && at[2] == 0);
    }
    EXPECT_EQ(seen.size(), 12u);  // every coordinate once
  }
}

TEST(Layout, RefusesAMeshThatDoesNotNameEachDimOnce) {
  for (std::vector<std::string> order : {std::vector<std::string>{"pp", "dp"}, {"pp", "dp", "dp"}, {"pp", "dp", "cp"}}) {
    try {
      Layout(config_with(order), 0);
      ADD_FAILURE() << "accepted a bad mesh";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("parallel.mesh"), std::string::npos) << e.what();
    }
  }
}


// parallel.cp joins the mesh just outside tp (or where parallel.mesh names it) only when above
// one; the sequence of the ids and activations is sharded over it.
TEST(Layout, ContextParallelDimSitsOutsideTpAndShardsTheSequence) {
  ParallelConfig c;
  c.dp = 2;
  c.cp = 2;
  c.tp = 2;
  c.sp = true;
  c.mesh = {"pp", "dp", "tp"};  // an order written before cp: cp goes just outside tp
  const Layout l(c, 5);         // row-major over [pp 1, dp 2, cp 2, tp 2]: dp 1, cp 0, tp 1
  EXPECT_EQ(l.world_mesh().dim_names(), (std::vector<std::string>{"pp", "dp", "cp", "tp"}));
  EXPECT_EQ(l.coord("dp"), 1);
  EXPECT_EQ(l.coord("cp"), 0);
  EXPECT_EQ(l.coord("tp"), 1);
  EXPECT_EQ(placements_str(l.ids_placements()), "[S(0),S(1),R]");
  EXPECT_EQ(placements_str(l.activation_placements()), "[S(0),S(1),S(1)]");
  // Without cp the meshes are those of before: no dim of one rank.
  ParallelConfig plain;
  plain.dp = 2;
  const Layout p(plain, 1);
  EXPECT_FALSE(p.has_dim("cp"));
  EXPECT_EQ(p.coord("cp"), 0);
  EXPECT_EQ(placements_str(p.ids_placements()), "[S(0),R]");
}

TEST(Layout, ContextParallelKeysAreCheckedNamingTheKey) {
  auto error_of = [](ParallelConfig c, int64_t seq, int64_t heads, int64_t kv) {
    try {
      c.validate_cp(seq, heads, kv);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  ParallelConfig c;
  c.cp = 2;
  EXPECT_EQ(error_of(c, 16, 4, 2), "");
  EXPECT_NE(error_of(c, 6, 4, 2).find("train.seq_len (6) must be a multiple of 2 · parallel.cp = 4"), std::string::npos);
  c.cp_method = "all_to_all";
  EXPECT_EQ(error_of(c, 6, 4, 2), "");
  c.tp = 2;
  EXPECT_NE(error_of(c, 16, 4, 2).find("key/value heads (2)"), std::string::npos);
  c.cp_method = "ulysses";
  EXPECT_NE(error_of(c, 16, 4, 2).find("parallel.cp_method must be ring or all_to_all, got 'ulysses'"),
            std::string::npos);
}

}  // namespace
}  // namespace tessel::parallel
