// The cost model: how long the pieces of a training step take on a cluster, and how much
// memory they hold.
//
// Compute comes from the op registry: each op of a transformer layer is described by its
// shapes, the registry gives its FLOPs and bytes, and a roofline with the cluster's calibrated
// efficiencies turns them into time (GEMMs: FLOPs at peak x gemm_efficiency, lower for small
// dims, see gemm_size; everything else: bytes at memory bandwidth x memory_efficiency; plus a per-kernel
// overhead). Backward costs twice the forward FLOPs for GEMMs (input and weight gradients) and
// twice the bytes for streaming ops. Collectives use an alpha-beta model with nccl-tests'
// bus-bandwidth factors, per algorithm (ring, tree, hierarchical across nodes) and link level.
// Memory follows Korthikanti et al. 2022 for activations (with tensor/sequence parallelism and
// selective or full recompute) and the ZeRO paper's per-parameter bytes by sharding stage.
#pragma once

#include <string>
#include <vector>

#include "tessel/plan/cluster.h"
#include "tessel/plan/model_spec.h"

namespace tessel::plan {

// Bytes per parameter and per activation element of the training precision. "bf16": mixed
// precision as Megatron-LM trains (bf16 weights, fp32 main gradients, fp32 master weights and
// Adam moments: 2 + 4 + 12 bytes); "f32": tessel's CPU trainer (4 + 4 + 8).
struct Precision {
  double param = 2, grad = 4, optimizer = 12, activation = 2;
};
Precision precision_for(const std::string& dtype);
// Bytes an optimizer step streams per parameter: its states read and written, the gradient and
// the parameter once each.
inline double optimizer_step_bytes(const Precision& p) { return 2 * p.optimizer + p.grad + p.param; }

// One collective group as laid out on the cluster: `size` ranks, `per_node` of them on each
// node they touch (size == per_node: inside one node).
struct GroupSpan {
  int size = 1;
  int per_node = 1;
};

// Alpha-beta times of collectives over `bytes` (the full buffer: all_reduce's buffer,
// all_gather's output, reduce_scatter's input). Ring and tree are both considered and the
// faster taken; groups spanning nodes with several ranks per node use the hierarchical form
// (reduce_scatter inside the node, the cross-node step on 1/per_node of the data per rank,
// all_gather inside the node).
double all_reduce_time(const Cluster& c, double bytes, GroupSpan g);
double all_gather_time(const Cluster& c, double bytes, GroupSpan g);  // == reduce_scatter
double p2p_time(const Cluster& c, double bytes, bool inter_node);
// An all_to_all in which each rank sends `bytes` in all (1/size of it to each rank, its own
// share included, which stays home): pairwise exchange, size - 1 messages per rank. Of what
// leaves, the share bound for ranks of the same node crosses the node's link level and the rest
// the level between nodes, each on its own links at once: the slower level decides.
double all_to_all_time(const Cluster& c, double bytes, GroupSpan g);

// The load of the busiest of `ep` expert-parallel ranks relative to the mean, when each of
// them routes `assignments` token-expert pairs (tokens x top_k) and a router the balancing loss
// keeps even sends each pair to any rank alike: a rank's load is then Binomial(ep x
// assignments, 1/ep), and the expected maximum of ep of them is about mean + sigma x
// sqrt(2 ln ep) (the normal approximation), so the factor is 1 + sqrt(2 ln(ep) (1 - 1/ep) /
// assignments). A capacity (capacity_factor > 0) caps it. 1 for ep = 1: one rank takes all.
double moe_imbalance(const ModelSpec& m, double assignments, int ep);

// The size d of an m x n x k GEMM on the efficiency curve gemm_efficiency * d / (d +
// gemm_half_dim), as calibration.gemm_size says. "smallest": its smallest dim — on GPUs a dim
// below the tile size leaves tiles and waves part empty. "harmonic": the harmonic mean of its
// dims — on CPUs, with register-sized tiles, the work beyond the FLOPs (packing the operands,
// reading them and writing the result) grows with mk + kn + mn, which relative to the 2mnk
// FLOPs goes as 1/m + 1/n + 1/k. A square GEMM's d is its side either way.
double gemm_size(const Calibration& c, double m, double n, double k);

// Per micro-batch times (seconds) of one transformer layer on one device, and its FLOPs.
struct LayerCost {
  double fwd = 0;          // forward compute
  double bwd_input = 0;    // backward, input gradients
  double bwd_weight = 0;   // backward, weight gradients
  double tp_fwd = 0;       // tensor-parallel collectives of the forward (exposed: what the
                           // software's overlap, if any, leaves)
  double tp_bwd = 0;       // ... of the backward
  double recompute = 0;    // forward work redone in the backward (full: the layer, incl. its comm;
                           // selective: QK^T and softmax of the attention)
  double flops_fwd = 0;    // FLOPs of the forward on this device
  double tp_hidden = 0;    // tensor-parallel time hidden behind GEMMs (software overlap.tp_comm), fwd + bwd
  double tp_bytes = 0;     // bytes through tensor-parallel collectives per micro-batch, fwd + bwd
  // Expert parallel: the all_to_alls that send tokens to their experts and back (dispatch and
  // combine in the forward, their gradients in the backward), all exposed.
  double ep_fwd = 0, ep_bwd = 0, ep_bytes = 0;
  // Context parallel: exposed communication (ring: what the attention of the block in hand
  // does not cover of each key/value transfer; all_to_all: the four reshards, all exposed),
  // and the ring's transfer time hidden behind the attention, fwd + bwd.
  double cp_fwd = 0, cp_bwd = 0, cp_hidden = 0, cp_bytes = 0;
  double imbalance = 1;    // expert load of the busiest ep rank over the mean (moe_imbalance)
  int kernels = 0;         // forward kernels
};

struct LayerShape {
  int64_t micro_batch = 1;
  int tp = 1;
  bool sp = false;
  std::string recompute = "none";  // none | selective | full
  GroupSpan tp_group;              // where the tensor-parallel ranks sit
  int busy_devices_per_node = 0;   // devices of a node computing while this layer runs, for the
                                   // share of shared cores (Cluster::compute_share); 0: all
  // The attention runs fused (calibration.fused_attention): it keeps one f32 log-sum-exp per
  // (head, query) for its backward, never the s x s scores.
  bool fused_attention = false;
  // Expert parallel: the experts of a sparse block split over `ep` ranks (which also split the
  // batch); `moe`: this block's MLP is the mixture of experts (layer_cost), or the cost is one
  // sparse block's (activation bytes).
  int ep = 1;
  GroupSpan ep_group;
  bool moe = false;
  // Context parallel: the sequence split over `cp` ranks, attention by a ring of key/value
  // blocks ("ring") or by heads after an all_to_all ("all_to_all").
  int cp = 1;
  std::string cp_method = "ring";
  GroupSpan cp_group;
};

LayerCost layer_cost(const ModelSpec& m, const Cluster& c, const LayerShape& s);
// The embedding (first stage) and the LM head with the loss (last stage), per micro-batch.
LayerCost embedding_cost(const ModelSpec& m, const Cluster& c, const LayerShape& s);
LayerCost head_cost(const ModelSpec& m, const Cluster& c, const LayerShape& s);

// Activation bytes one layer holds per micro-batch between its forward and its backward
// (Korthikanti et al. 2022, generalised to grouped-query attention, SwiGLU, mixtures of experts
// — the experts' intermediates for tokens x top_k rows — and context parallelism, which
// leaves each rank seq / cp of every sequence), and the
// working set a layer needs while it runs its backward (what full recompute rebuilds).
double layer_activation_bytes(const ModelSpec& m, const Precision& p, const LayerShape& s);
double layer_working_bytes(const ModelSpec& m, const Precision& p, const LayerShape& s);

// Model FLOPs of one step, by Narayanan et al. 2021's count generalised to any MLP width and
// grouped-query attention: per token 2 x (matmul parameters) + 4 x layers x seq x hidden
// (attention scores and values) + 2 x vocab x hidden (logits), times 3 for forward and
// backward; `recompute` adds the forward again (full) — then this is the paper's
// 96·B·s·l·h²(1 + s/6h + V/16lh) exactly — or the attention's QK^T (selective: tessel's sdpa
// rebuilds the probabilities but keeps its output, so P·V is not redone; Korthikanti et al.
// count both). A sparse block counts its router and the top_k experts each token passes
// through (and the shared experts): the FLOPs of the active experts, as Megatron-Core counts
// MoE models (training.py's num_floating_point_operations, which leaves out the router's
// h x experts, 0.01% of Mixtral's).
double step_flops(const ModelSpec& m, int64_t global_batch, const std::string& recompute);

}  // namespace tessel::plan
