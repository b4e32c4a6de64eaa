// The planner's expert parallel (issue 29) and context parallel (issue 30): the Mixtral presets
// against Hugging Face's sizes, the cost model's MoE compute, imbalance, all_to_all and memory
// against their formulas, the runtime's rules in the search, and the search choosing ep for a
// mixture of experts and cp where a long sequence does not fit without it.
#include <gtest/gtest.h>

#include <cmath>

#include "tessel/core/error.h"
#include "tessel/plan/published.h"

using namespace tessel;
using namespace tessel::plan;

namespace {

Layout layout(int dp, int tp, int pp, int ep, int cp = 1, const char* method = "ring", int stage = 1) {
  Layout l;
  l.dp = dp;
  l.tp = tp;
  l.pp = pp;
  l.ep = ep;
  l.cp = cp;
  l.cp_method = method;
  l.sp = tp > 1;
  l.sharding_stage = stage;
  return l;
}

// A long-context Llama: llama3-8b's sizes at `seq` tokens.
ModelSpec long_llama(int64_t seq) {
  ModelSpec m = model_preset("llama3-8b");
  m.seq = seq;
  return m;
}

}  // namespace

// Hugging Face's Mixtral sizes: 46.7B parameters of which 12.9B active per token (8x7B), 141B
// and 39B (8x22B), as Mistral AI states them.
TEST(Mixtral, PresetsHaveTheReleasedSizes) {
  const ModelSpec a = model_preset("mixtral-8x7b"), b = model_preset("mixtral-8x22b");
  EXPECT_NEAR(a.parameters() / 46.7e9, 1.0, 0.01);
  EXPECT_NEAR(b.parameters() / 141e9, 1.0, 0.01);
  auto active = [](const ModelSpec& m) {
    return m.parameters() - static_cast<double>(m.layers) * m.expert_parameters() * (1 - double(m.top_k) / m.experts);
  };
  EXPECT_NEAR(active(a) / 12.9e9, 1.0, 0.01);
  EXPECT_NEAR(active(b) / 39e9, 1.0, 0.02);
  EXPECT_EQ(a.moe_layers(0, a.layers), 32);
  ModelSpec every_second = a;
  every_second.moe_every = 2;  // decoder_sparse_step 2: blocks 1, 3, 5, ...
  EXPECT_EQ(every_second.moe_layers(0, 32), 16);
  EXPECT_EQ(every_second.moe_layers(1, 2), 1);
  EXPECT_EQ(every_second.moe_layers(0, 1), 0);
}

// Megatron-Core's FLOP count for MoE models (training.py num_floating_point_operations, at
// core_v0.9.0): 12·B·s·l·h²·[(1 + g/a + s/h)·q/h + ffn/h·topk·3/2 + V/(2lh)] — step_flops adds
// only the router's 2·h·E per token and layer.
TEST(Mixtral, StepFlopsIsMegatronsMoeCount) {
  const ModelSpec m = model_preset("mixtral-8x7b");
  const double B = 256, s = m.seq, l = m.layers, h = m.hidden, a = m.heads, g = m.kv_heads, f = m.ffn,
               V = m.vocab, k = m.top_k;
  const double megatron = 12 * B * s * l * h * h * ((1 + g / a + s / h) + f / h * k * 1.5 + V / (2 * l * h));
  const double router = 3 * B * s * l * 2 * h * m.experts;
  EXPECT_NEAR(step_flops(m, 256, "none") / (megatron + router), 1.0, 1e-9);
  EXPECT_LT(router / megatron, 2e-4);
}

// A sparse block's forward is the dense one's with the MLP's FLOPs times top_k, plus the
// router's; the grouped GEMMs take the busiest rank's rows (the imbalance factor).
TEST(CostModel, SparseBlockChargesTheActiveExperts) {
  const ModelSpec m = model_preset("mixtral-8x7b");
  const Cluster c = cluster_preset("dgx-h100:64");
  LayerShape dense;
  dense.micro_batch = 1;
  LayerShape sparse = dense;
  sparse.moe = true;
  const double tokens = static_cast<double>(m.seq), h = m.hidden, f = m.ffn;
  const double extra = layer_cost(m, c, sparse).flops_fwd - layer_cost(m, c, dense).flops_fwd;
  const double expected = tokens * (2 * h * m.experts + (m.top_k - 1) * 6 * h * f);
  EXPECT_NEAR(extra / expected, 1.0, 0.01);
  // Over 8 expert-parallel ranks the busiest one computes imbalance x its share.
  sparse.ep = 8;
  sparse.ep_group = GroupSpan{8, 8};
  const LayerCost lc = layer_cost(m, c, sparse);
  const double imbalance = moe_imbalance(m, tokens * m.top_k, 8);
  EXPECT_DOUBLE_EQ(lc.imbalance, imbalance);
  EXPECT_NEAR((lc.flops_fwd - layer_cost(m, c, dense).flops_fwd) / (tokens * (2 * h * m.experts + (m.top_k * imbalance - 1) * 6 * h * f)),
              1.0, 0.01);
  // Dispatch and combine, forward and backward: tokens x top_k x hidden bf16 each.
  EXPECT_DOUBLE_EQ(lc.ep_bytes, 4 * tokens * m.top_k * h * 2);
  EXPECT_DOUBLE_EQ(lc.ep_fwd, 2 * all_to_all_time(c, tokens * m.top_k * h * 2, GroupSpan{8, 8}));
  EXPECT_DOUBLE_EQ(lc.ep_bwd, lc.ep_fwd);
}

// The expected maximum of ep Binomial(ep·n, 1/ep) loads over their mean n, by the normal
// approximation; a capacity caps it; one rank has no one to be busier than.
TEST(CostModel, ExpertImbalanceIsTheExpectedMaximumLoad) {
  ModelSpec m = model_preset("mixtral-8x7b");
  EXPECT_DOUBLE_EQ(moe_imbalance(m, 8192, 1), 1.0);
  EXPECT_NEAR(moe_imbalance(m, 8192, 8), 1 + std::sqrt(2 * std::log(8.0) * (7.0 / 8) / 8192), 1e-12);
  EXPECT_GT(moe_imbalance(m, 64, 8), moe_imbalance(m, 8192, 8));  // fewer tokens, rougher
  EXPECT_GT(moe_imbalance(m, 8192, 64), moe_imbalance(m, 8192, 8));  // more ranks, a higher maximum
  m.capacity_factor = 1.1;
  EXPECT_DOUBLE_EQ(moe_imbalance(m, 16, 64), 1.1);
}

// all_to_all: each rank keeps 1/n of its bytes, sends the rest pairwise; what goes to ranks on
// other nodes crosses the slower level.
TEST(CostModel, AllToAllIsCostedPerLevel) {
  const Cluster c = cluster_preset("dgx-h100:64");
  const double bytes = 64e6;
  const double intra = c.intra.bandwidth * c.calibration.link_share(false);
  const double inter = c.inter.bandwidth * c.calibration.link_share(true);
  EXPECT_DOUBLE_EQ(all_to_all_time(c, bytes, GroupSpan{1, 1}), 0.0);
  EXPECT_NEAR(all_to_all_time(c, bytes, GroupSpan{8, 8}), 7 * (c.intra.latency + bytes / 8 / intra), 1e-12);
  EXPECT_NEAR(all_to_all_time(c, bytes, GroupSpan{8, 1}), 7 * (c.inter.latency + bytes / 8 / inter), 1e-12);
  // 16 ranks on 2 nodes: 7 peers inside, 8 outside; the slower level decides.
  EXPECT_NEAR(all_to_all_time(c, bytes, GroupSpan{16, 8}),
              std::max(7 * (c.intra.latency + bytes / 16 / intra), 8 * (c.inter.latency + bytes / 16 / inter)), 1e-12);
  EXPECT_GT(all_to_all_time(c, bytes, GroupSpan{8, 1}), all_to_all_time(c, bytes, GroupSpan{8, 8}));
}

// Expert parallel splits the experts' parameters, gradients and optimizer states over ep (and
// ZeRO the rest over dp); the dense ones stay whole on every ep rank.
TEST(Planner, ExpertParallelSplitsTheExpertsMemory) {
  const ModelSpec m = model_preset("mixtral-8x7b");
  const Cluster c = cluster_preset("dgx-h100:64");
  const Precision p = precision_for(c.dtype);
  const Estimate one = evaluate(m, c, layout(2, 1, 32, 1, 1, "ring", 0), 256);
  const Estimate eight = evaluate(m, c, layout(2, 1, 4, 8, 1, "ring", 0), 256);
  // pp 32: one block per rank (the fullest, rank 0, also the embedding); pp 4 x ep 8:
  // eight blocks, their experts split eight ways.
  const double block = m.moe_layer_parameters(), experts = m.expert_parameters();
  const double head = static_cast<double>(m.vocab * m.hidden);  // rank 0 (the most activations in flight): the embedding
  EXPECT_NEAR(one.memory.params / ((block + head) * p.param), 1.0, 1e-6);
  EXPECT_NEAR(eight.memory.params / ((8 * (block - experts + experts / 8) + head) * p.param), 1.0, 1e-6);
  // ZeRO-1 over dp 2 halves the optimizer states of both kinds.
  const Estimate zero = evaluate(m, c, layout(2, 1, 4, 8, 1, "ring", 1), 256);
  EXPECT_NEAR(zero.memory.optimizer / eight.memory.optimizer, 0.5, 1e-9);
  EXPECT_GT(eight.ep_comm, 0);
  EXPECT_EQ(one.ep_comm, 0);
  // ep 8 of 8 experts inside a node: the all_to_all stays on NVSwitch.
  EXPECT_EQ(eight.mapping.span("ep", eight.layout, c).per_node, 8);
}

// The runtime's rules (cli/config.cc, parallel/layout.cc): ep divides the experts of a mixture
// of experts; cp with a capacity is refused for them (dropless routing splits), ring needs seq a multiple of 2·cp (with
// dropout too: its masks follow the ring's order), all_to_all tp·cp dividing the heads and kv heads.
TEST(Planner, ExpertAndContextParallelFollowTheRuntimesRules) {
  const ModelSpec moe = model_preset("mixtral-8x7b"), dense = model_preset("llama3-8b");
  const Cluster c = cluster_preset("dgx-h100:64");
  auto error = [&](const ModelSpec& m, const Layout& l) {
    try {
      evaluate(m, c, l, 256, false);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error(moe, layout(1, 1, 4, 16)).find("ep 16 must divide the model's experts (8"), std::string::npos);
  EXPECT_NE(error(dense, layout(4, 1, 2, 8)).find("ep 8 must divide"), std::string::npos);
  EXPECT_EQ(error(moe, layout(4, 1, 4, 2, 2)), "");  // dropless routing splits over cp
  ModelSpec capped = moe;
  capped.capacity_factor = 1.25;
  EXPECT_NE(error(capped, layout(4, 1, 4, 2, 2)).find("a capacity (factor 1.25) ranks each sequence's assignments"),
            std::string::npos);
  EXPECT_NE(error(dense, layout(1, 8, 1, 1, 8, "all_to_all")).find("tp x cp = 64 must divide the 32 heads and 8 kv"),
            std::string::npos);
  EXPECT_EQ(error(dense, layout(4, 2, 2, 1, 4, "all_to_all")), "");
  EXPECT_EQ(error(dense, layout(4, 2, 2, 1, 4, "ring")), "");
  ModelSpec odd = dense;
  odd.seq = 4100;  // a multiple of 4, not of 8
  EXPECT_NE(error(odd, layout(4, 2, 2, 1, 4, "ring")).find("multiple of 2 x cp = 8"), std::string::npos);
  ModelSpec dropout = model_preset("gpt-1.7b");
  ASSERT_GT(dropout.dropout, 0.0);
  EXPECT_EQ(cp_refusal(dropout, 1, 2, "ring"), "");
  EXPECT_EQ(cp_refusal(dropout, 1, 2, "all_to_all"), "");

  // The search space holds only what the runtime accepts, and ep only for sparse models; cp for
  // a sparse model only with dropless routing.
  PlanOptions o;
  o.global_batch = 256;
  int with_ep = 0, moe_with_cp = 0;
  for (const Layout& l : candidate_layouts(moe, c, o)) {
    EXPECT_EQ(cp_refusal(moe, l.tp, l.cp, l.cp_method), "") << l.str();
    EXPECT_EQ(moe.experts % l.ep, 0) << l.str();
    with_ep += l.ep > 1;
    moe_with_cp += l.cp > 1;
  }
  EXPECT_GT(with_ep, 0);
  EXPECT_GT(moe_with_cp, 0);
  for (const Layout& l : candidate_layouts(capped, c, o)) EXPECT_EQ(l.cp, 1) << l.str();
  int with_cp = 0;
  for (const Layout& l : candidate_layouts(dense, c, o)) {
    EXPECT_EQ(l.ep, 1) << l.str();
    EXPECT_EQ(cp_refusal(dense, l.tp, l.cp, l.cp_method), "") << l.str();
    with_cp += l.cp > 1;
  }
  EXPECT_GT(with_cp, 0);
}

// Mixtral on 64 H100s: the search puts the experts on expert-parallel ranks inside a node, as
// Megatron-Core's reference mapping does (EP 8), rather than replicate them.
TEST(Planner, SearchPicksExpertParallelForAMixtureOfExperts) {
  const ModelSpec m = model_preset("mixtral-8x7b");
  const Cluster c = cluster_preset("dgx-h100:64");
  PlanOptions o;
  o.global_batch = 256;
  o.top = 3;
  const SearchResult r = search(m, c, o);
  ASSERT_FALSE(r.best.empty());
  for (const Estimate& e : r.best) {
    EXPECT_GT(e.layout.ep, 1) << e.layout.str();
    EXPECT_TRUE(e.fits);
  }
  o.allow_ep = false;
  const SearchResult without = search(m, c, o);
  ASSERT_FALSE(without.best.empty());
  EXPECT_LT(r.best.front().step_time, without.best.front().step_time);
  std::printf("mixtral-8x7b on 64 H100: best %s, %.3f s/step (without ep: %s, %.3f s)\n",
              r.best.front().layout.str().c_str(), r.best.front().step_time, without.best.front().layout.str().c_str(),
              without.best.front().step_time);
}

// A long sequence that fits no layout without context parallel gets cp > 1; a short one keeps
// cp 1 (splitting the sequence only adds communication where the batch can be split instead).
TEST(Planner, SearchPicksContextParallelWhereALongSequenceNeedsIt) {
  const Cluster c = cluster_preset("dgx-h100:16");
  PlanOptions o;
  o.global_batch = 4;
  o.top = 3;
  const ModelSpec longer = long_llama(524288);
  o.allow_cp = false;
  const SearchResult without = search(longer, c, o);
  EXPECT_TRUE(without.best.empty()) << without.best.front().layout.str();
  o.allow_cp = true;
  const SearchResult with = search(longer, c, o);
  ASSERT_FALSE(with.best.empty());
  for (const Estimate& e : with.best) {
    EXPECT_GT(e.layout.cp, 1) << e.layout.str();
    EXPECT_TRUE(e.fits);
  }
  std::printf("llama3-8b at seq 524288 on 16 H100: %lld layouts without cp, none fits; best with cp: %s, %.1f GB\n",
              static_cast<long long>(without.candidates), with.best.front().layout.str().c_str(),
              with.best.front().memory.total() / 1e9);
  o.global_batch = 64;
  const SearchResult shorter = search(long_llama(4096), c, o);
  ASSERT_FALSE(shorter.best.empty());
  EXPECT_EQ(shorter.best.front().layout.cp, 1) << shorter.best.front().layout.str();
}

// Context parallel's costs: activations per rank shrink with the sequence share; the ring's
// transfers hide behind the attention of the block in hand (exposed only beyond it);
// all_to_all's four reshards per attention are all exposed.
TEST(CostModel, ContextParallelSplitsActivationsAndOverlapsTheRing) {
  const ModelSpec m = long_llama(131072);
  const Cluster c = cluster_preset("dgx-h100:16");
  const Precision p = precision_for(c.dtype);
  LayerShape s;
  s.micro_batch = 1;
  s.fused_attention = true;
  const double whole = layer_activation_bytes(m, p, s);
  s.cp = 4;
  EXPECT_NEAR(layer_activation_bytes(m, p, s) / whole, 0.25, 1e-9);
  // Ring inside a node: K and V blocks of seq/4 tokens, 3 steps, each under a quarter of the
  // rank's attention.
  s.cp_group = GroupSpan{4, 4};
  const LayerCost ring = layer_cost(m, c, s);
  const double block = 2.0 * (131072 / 4) * m.kv_heads * m.head_dim() * 2;
  EXPECT_DOUBLE_EQ(ring.cp_bytes, 3 * 3 * block);
  const double transfer = p2p_time(c, block, false);
  EXPECT_GT(ring.cp_hidden, 0);
  // At 131072 tokens the attention dwarfs the transfers: nothing exposed.
  EXPECT_DOUBLE_EQ(ring.cp_fwd, 0.0);
  EXPECT_DOUBLE_EQ(ring.cp_bwd, 0.0);
  EXPECT_NEAR(ring.cp_hidden, 3 * transfer + 3 * p2p_time(c, 2 * block, false), 1e-12);
  // Across nodes on a short sequence the transfer outlasts the block's attention: the excess is exposed.
  ModelSpec shorter = long_llama(8192);
  s.cp_group = GroupSpan{4, 1};
  const LayerCost far = layer_cost(shorter, c, s);
  const double far_block = 2.0 * (8192 / 4) * m.kv_heads * m.head_dim() * 2;
  EXPECT_GT(far.cp_fwd, 0);
  EXPECT_NEAR(far.cp_fwd + far.cp_bwd + far.cp_hidden,
              3 * (p2p_time(c, far_block, true) + p2p_time(c, 2 * far_block, true)), 1e-12);
  // all_to_all: q, k, v in and the output back, forward and backward, all exposed.
  s.cp_method = "all_to_all";
  s.cp_group = GroupSpan{4, 4};
  const LayerCost a2a = layer_cost(m, c, s);
  const double q = (131072 / 4) * static_cast<double>(m.heads) * m.head_dim() * 2;
  const double kv = (131072 / 4) * static_cast<double>(m.kv_heads) * m.head_dim() * 2;
  EXPECT_NEAR(a2a.cp_fwd, 2 * all_to_all_time(c, q, s.cp_group) + 2 * all_to_all_time(c, kv, s.cp_group), 1e-12);
  EXPECT_DOUBLE_EQ(a2a.cp_bwd, a2a.cp_fwd);
  EXPECT_DOUBLE_EQ(a2a.cp_hidden, 0.0);
  // Either way each rank computes 1/cp of the attention.
  LayerShape one;
  one.micro_batch = 1;
  EXPECT_NEAR(ring.flops_fwd / layer_cost(m, c, one).flops_fwd, 0.25, 1e-3);
  EXPECT_NEAR(a2a.flops_fwd / layer_cost(m, c, one).flops_fwd, 0.25, 1e-3);
}
