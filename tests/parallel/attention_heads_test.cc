// GPT-2 attention under tensor parallelism shards heads, as Megatron does: c_attn's weight
// [C, 3, C] is split on its last dim, so each tp rank projects the q, k and v of its own heads
// and attends over those only. Checked on 2 thread ranks by what actually ran: the
// collectives issued (no all_gather of the packed [B, T, 3C] projection, forward or backward),
// the local shapes sdpa recorded on the tape, and the result against the single-rank block.
#include <gtest/gtest.h>

#include <deque>
#include <set>

#include "tessel/autograd/engine.h"
#include "tessel/comm/thread_backend.h"
#include "tessel/comm/world.h"
#include "tessel/core/philox.h"
#include "tessel/core/view.h"
#include "tessel/dist/dtensor.h"
#include "tessel/dist/mesh_comm.h"
#include "tessel/nn/models.h"
#include "tessel/ops/ops.h"
#include "tessel/parallel/parallelize.h"

namespace tessel {
namespace {

constexpr int64_t kB = 2, kT = 5, kC = 16, kH = 4, kD = kC / kH;

nn::Gpt2Config config() {
  nn::Gpt2Config c;
  c.n_layer = 1;
  c.n_embd = kC;
  c.n_head = kH;
  c.vocab_size = 7;
  c.n_positions = kT;
  c.dropout = 0;
  return c;
}

using Counts = std::map<std::string, std::pair<int64_t, int64_t>>;  // op -> (calls, bytes)

// What this rank issued on the mesh's dim groups since the last call (which resets them).
Counts issued(const ProcessMesh& mesh) {
  Counts c;
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    std::shared_ptr<ProcessGroup> g = mesh_dim_group(mesh, m);
    for (const auto& [op, e] : g->stats().ops) {
      if (op == "barrier") continue;
      c[op].first += e.calls;
      c[op].second += e.bytes;
    }
    g->reset_stats();
  }
  return c;
}

// The tape node of `op` reached backwards from `y` (null when there is none).
std::shared_ptr<GradNode> find_node(const Tensor& y, const std::string& op) {
  std::deque<std::shared_ptr<GradNode>> todo{y.grad_fn()};
  std::set<GradNode*> seen;
  while (!todo.empty()) {
    std::shared_ptr<GradNode> n = todo.front();
    todo.pop_front();
    if (!n || !seen.insert(n.get()).second) continue;
    if (n->name().rfind(op + " ", 0) == 0 || n->name() == op) return n;
    for (const GradEdge& e : n->next_edges) todo.push_back(e.node);
  }
  return nullptr;
}

TEST(AttentionHeads, TensorParallelGpt2AttendsOverItsOwnHeadsWithoutGatheringQkv) {
  const uint64_t seed = 11;
  Tensor x_full = Tensor::empty({kB, kT, kC}, DType::f32);
  rng_fill(x_full, Distribution::normal, 0, 1, 5, 6);
  // The single-rank block: the oracle.
  nn::Gpt2 ref(config());
  ref.materialize(seed);
  Tensor x_ref = view::clone(x_full);
  x_ref.set_requires_grad(true);
  Tensor y_ref = ref.block(0, x_ref);
  backward(sum(y_ref));
  const std::vector<double> want = y_ref.to_doubles(), want_dx = x_ref.grad().to_doubles();

  spawn(2, [&](int rank) {
    parallel::ParallelConfig pc;
    pc.tp = 2;
    parallel::Layout layout(pc, rank);
    const ProcessMesh mesh = layout.stage_mesh();
    nn::Gpt2 model(config());
    parallel::parallelize(model, model.parameters(), mesh, parallel::gpt2_plan(), layout, seed);
    model.train(true);

    // Each rank holds the q, k and v columns of its heads: [C, 3, C/tp].
    const Tensor& w = model.parameter("transformer.h.0.attn.c_attn.weight").value;
    EXPECT_EQ(placements_str(dist_attr(w).placements), placements_str({Replicate(), Shard(2)}));
    EXPECT_EQ(local_piece(w).shape(), (Shape{kC, 3, kC / 2}));
    EXPECT_EQ(local_piece(model.parameter("transformer.h.0.attn.c_attn.bias").value).shape(), (Shape{3, kC / 2}));

    Tensor x = shard_tensor(x_full, mesh, {Replicate(), Replicate()});
    x.set_requires_grad(true);
    issued(mesh);
    Tensor y = model.block(0, x);
    // Forward: the two RowWise outputs (attention's and the MLP's c_proj) are all-reduced;
    // nothing is gathered — in particular not the packed [B, T, 3C] projection.
    Counts fwd = issued(mesh);
    EXPECT_EQ(fwd.count("all_gather"), 0u);
    ASSERT_EQ(fwd.count("all_reduce"), 1u);
    EXPECT_EQ(fwd["all_reduce"].first, 2);
    EXPECT_EQ(fwd["all_reduce"].second, 2 * kB * kT * kC * 4);

    // sdpa ran on this rank's H/tp heads: the tape holds q [B, H, T, D] globally and its
    // per-row log-sum-exp [B, H/tp, T] locally (the fused kernel keeps no [T, T] weights).
    std::shared_ptr<GradNode> attn = find_node(y, "sdpa");
    ASSERT_NE(attn, nullptr);
    EXPECT_EQ(attn->input_metas[0].shape, (Shape{kB, kH, kT, kD}));
    ASSERT_EQ(attn->output_metas.size(), 2u);
    EXPECT_EQ(attn->output_metas[1].shape, (Shape{kB, kH / 2, kT}));

    backward(sum(y));
    Counts bwd = issued(mesh);
    EXPECT_EQ(bwd.count("all_gather"), 0u);

    const double tol = 1e-5;
    std::vector<double> got = full_tensor(y).to_doubles(), got_dx = full_tensor(x.grad()).to_doubles();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << i;
    ASSERT_EQ(got_dx.size(), want_dx.size());
    for (size_t i = 0; i < got_dx.size(); ++i) EXPECT_NEAR(got_dx[i], want_dx[i], tol) << i;
  });
}

// tp must give each rank whole heads: a reshape of C onto (H, D) keeps C's shard only then.
TEST(AttentionHeads, HeadsShardOntoTheHeadDimOfTheReshape) {
  spawn(2, [&](int) {
    ProcessMesh mesh = ProcessMesh::iota({1, 2}, {"dp", "tp"});
    Tensor qkv = shard_tensor(Tensor::zeros({kB, kT, 3, kC}, DType::f32), mesh, {Replicate(), Shard(3)});
    Tensor heads = reshape(qkv, {kB, kT, 3, kH, kD});
    EXPECT_EQ(placements_str(dist_attr(heads).placements), placements_str({Replicate(), Shard(3)}));
    EXPECT_EQ(local_piece(heads).shape(), (Shape{kB, kT, 3, kH / 2, kD}));
    std::vector<Tensor> parts = split(heads, {1, 1, 1}, 2);
    Tensor q = permute(squeeze(parts[0], 2), {0, 2, 1, 3});
    EXPECT_EQ(placements_str(dist_attr(q).placements), placements_str({Replicate(), Shard(1)}));
    EXPECT_EQ(local_piece(q).shape(), (Shape{kB, kH / 2, kT, kD}));
  });
}

}  // namespace
}  // namespace tessel
