// Context parallel attention on thread ranks, against the single-rank sdpa: ring attention
// (the sequence held in the load-balanced order, key/value blocks passed around the ring) and
// all_to_all (sequence shards turned into head shards by a reshard), over 2 and 4 ranks, with
// grouped-query heads, document masks whose documents cross the shards, and dropout on the
// probabilities (also with the batch split over dp beside cp). Checked by value
// (outputs and the gradients of q, k and v) and by what ran: the ring's sends and receives and
// no gather of the sequence; the all_to_all's one all_to_all before and one after.
#include <gtest/gtest.h>

#include "tessel/autograd/engine.h"
#include "tessel/comm/thread_backend.h"
#include "tessel/core/philox.h"
#include "tessel/core/view.h"
#include "tessel/data/loader.h"
#include "tessel/dist/dtensor.h"
#include "tessel/dist/mesh_comm.h"
#include "tessel/nn/layers.h"
#include "tessel/ops/ops.h"
#include "tessel/parallel/data.h"

namespace tessel {
namespace {

constexpr int64_t kB = 2, kH = 4, kHkv = 2, kT = 32, kD = 8;

using Counts = std::map<std::string, int64_t>;  // op -> calls

Counts issued(const ProcessMesh& mesh) {
  Counts c;
  std::shared_ptr<ProcessGroup> g = mesh_dim_group(mesh, mesh.dim_index("cp"));
  for (const auto& [op, e] : g->stats().ops)
    if (op != "barrier") c[op] += e.calls;
  g->reset_stats();
  return c;
}

Tensor random(const Shape& s, uint64_t stream) {
  Tensor t = Tensor::empty(s, DType::f32);
  rng_fill(t, Distribution::normal, 0, 1, 3, stream);
  return t;
}

// x [B, H, T, D] with its sequence in `order` (entry i: the position of the i-th), or back.
Tensor reorder(const Tensor& x, const std::vector<int64_t>& order, bool back) {
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t from = back ? static_cast<int64_t>(i) : order[i], to = back ? order[i] : static_cast<int64_t>(i);
    view::copy(view::select(out, 2, to), view::select(x, 2, from));
  }
  return out;
}

void expect_near(const Tensor& got, const Tensor& want, const std::string& what) {
  const std::vector<double> g = got.to_doubles(), w = want.to_doubles();
  ASSERT_EQ(g.size(), w.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(g[i] - w[i]));
  EXPECT_LE(worst, 2e-5) << what;
}

struct Case {
  int cp;
  const char* method;
  bool docs;
  double dropout = 0.0;
  int dp = 1;  // a mesh [dp, cp], the batch split over dp
};

TEST(ContextParallel, AttentionEqualsOneRankByRingAndByAllToAll) {
  const Tensor q0 = random({kB, kH, kT, kD}, 1), k0 = random({kB, kHkv, kT, kD}, 2), v0 = random({kB, kHkv, kT, kD}, 3);
  const Tensor dy = random({kB, kH, kT, kD}, 4);
  // Documents that start inside chunks and span several (row 1 pads with T).
  const Tensor docs = Tensor::from_doubles({0, 3, 13, 27, 0, 9, 32, 32}, {kB, 4}, DType::i64);
  for (const Case& c : {Case{2, "ring", false}, Case{4, "ring", false}, Case{2, "ring", true}, Case{4, "ring", true},
                        Case{2, "all_to_all", false}, Case{2, "all_to_all", true}, Case{2, "ring", false, 0.3},
                        Case{4, "ring", true, 0.3}, Case{2, "all_to_all", true, 0.3}, Case{2, "ring", true, 0.3, 2},
                        Case{2, "all_to_all", false, 0.3, 2}}) {
    SCOPED_TRACE(
        fmt::format("dp {} cp {} {}{} dropout {}", c.dp, c.cp, c.method, c.docs ? " with documents" : "", c.dropout));
    // Row 0 of this batch is row 6 of the step's: the mask's batch index counts from there.
    const SdpaDropout drop{c.dropout, 11, 29, 6};
    // The oracle: one rank, natural order.
    Tensor q = view::clone(q0), k = view::clone(k0), v = view::clone(v0);
    for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
    Tensor y = scaled_dot_product_attention(q, k, v, c.docs ? docs : Tensor(), true, 0.0, {}, drop);
    backward(sum(mul(y, dy)));
    const Tensor want = y.detach(), want_dq = q.grad(), want_dk = k.grad(), want_dv = v.grad();

    const std::vector<int64_t> order = parallel::cp_order(kT, c.cp, c.method);
    spawn(c.dp * c.cp, [&](int) {
      const ProcessMesh mesh =
          c.dp == 1 ? ProcessMesh::iota({c.cp}, {"cp"}) : ProcessMesh::iota({c.dp, c.cp}, {"dp", "cp"});
      const Placements split = c.dp == 1 ? Placements{Shard(2)} : Placements{Shard(0), Shard(2)};
      auto shard = [&](const Tensor& x) {
        Tensor t = shard_tensor(reorder(x, order, false), mesh, split);
        t.set_requires_grad(true);
        return t;
      };
      Tensor dq = shard(q0), dk = shard(k0), dv = shard(v0);
      const Tensor dd = c.dp == 1 || !c.docs ? docs : shard_tensor(docs, mesh, {Shard(0), Replicate()});
      issued(mesh);
      Tensor out = scaled_dot_product_attention(dq, dk, dv, c.docs ? dd : Tensor(), true, 0.0, c.method, drop);
      const Counts fwd = issued(mesh);
      EXPECT_EQ(fwd.count("all_gather"), 0u);
      if (std::string(c.method) == "ring") {
        EXPECT_EQ(placements_str(dist_attr(out).placements), c.dp == 1 ? "[S(2)]" : "[S(0),S(2)]");
        EXPECT_EQ(fwd.at("send"), c.cp - 1);  // one key/value block on each hop
        EXPECT_EQ(fwd.at("recv"), c.cp - 1);
      } else {
        EXPECT_EQ(placements_str(dist_attr(out).placements), c.dp == 1 ? "[S(1)]" : "[S(0),S(1)]");  // heads
        EXPECT_EQ(fwd.at("all_to_all"), 3);                               // q, k and v
      }
      Tensor g = shard_tensor(reorder(dy, order, false), mesh, dist_attr(out).placements);
      backward(sum(mul(out, g)));
      EXPECT_EQ(issued(mesh).count("all_gather"), 0u);
      expect_near(reorder(full_tensor(out), order, true), want, "out");
      expect_near(reorder(full_tensor(dq.grad()), order, true), want_dq, "dq");
      expect_near(reorder(full_tensor(dk.grad()), order, true), want_dk, "dk");
      expect_near(reorder(full_tensor(dv.grad()), order, true), want_dv, "dv");
    });
  }
}

// The layers' attention (nn::causal_attention) gives back the sequence split it was given:
// all_to_all's head-split output goes back by one more all_to_all.
TEST(ContextParallel, LayersReshardTheAllToAllOutputBackToTheSequence) {
  spawn(2, [&](int) {
    const ProcessMesh mesh = ProcessMesh::iota({2}, {"cp"});
    nn::sequence_state().cp_method = "all_to_all";
    Tensor q = shard_tensor(random({kB, kH, kT, kD}, 1), mesh, {Shard(2)});
    Tensor k = shard_tensor(random({kB, kHkv, kT, kD}, 2), mesh, {Shard(2)});
    Tensor v = shard_tensor(random({kB, kHkv, kT, kD}, 3), mesh, {Shard(2)});
    issued(mesh);
    Tensor y = nn::causal_attention(q, k, v, false);
    EXPECT_EQ(placements_str(dist_attr(y).placements), "[S(2)]");
    const Counts c = issued(mesh);
    EXPECT_EQ(c.at("all_to_all"), 4);  // q, k, v there, out back
    EXPECT_EQ(c.count("all_gather"), 0u);
    nn::sequence_state() = nn::SequenceState{};
  });
}


// data.pack_documents: the end-of-text token ends its document; the next starts after it, its
// positions from 0; the starts pad with S.
TEST(ContextParallel, PackedDocumentsGiveStartsAndPositionsRestartingPerDocument) {
  const Tensor ids = Tensor::from_doubles({5, 9, 0, 7, 0, 0, 3, 4, 1, 2, 3, 0}, {2, 6}, DType::i64);
  const PackedDocuments p = pack_documents(ids, 0);
  EXPECT_EQ(p.doc_starts.to_doubles(), (std::vector<double>{0, 3, 5, 6, 6, 6, 0, 6, 6, 6, 6, 6}));
  EXPECT_EQ(p.positions.to_doubles(), (std::vector<double>{0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 4, 5}));
}

}  // namespace
}  // namespace tessel
