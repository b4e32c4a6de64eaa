// A mixture-of-experts feed-forward block (issue 29): a router picks k of E SwiGLU experts per
// token; each expert runs on the tokens routed to it by one grouped GEMM (no loop of small
// products, no padding to a capacity unless one is set); the outputs come back weighted by the
// router; optional shared experts see every token. Mixtral's names: `gate` [E, C] and
// `experts.{w1, w3}` [E, F, C], `experts.w2` [E, C, F] (each expert's matrices stacked on a
// leading expert dim — the dim expert parallelism shards; checkpoints name each expert's
// `experts.<e>.w1.weight` as Hugging Face does, see Parameter::file_stack).
//
// Routing groups are sequences: the capacity and the load-balancing loss are per sequence, so
// which tokens are dropped and the losses do not depend on how the batch is split over ranks or
// micro-batches. Under context parallel a sequence's tokens lie on several ranks: they add up
// the group's assignment counts, each computes its part of the balancing loss, and only dropless
// routing is allowed (a capacity would rank the group's assignments together). The auxiliary and z losses reach the
// gradients without passing through the model's output: the block's output carries them (its backward adds their
// gradient, scaled by moe_step().loss_scale), the way Megatron-Core's MoE does — so they cross pipeline stages.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessel/nn/layers.h"
#include "tessel/nn/moe_router.h"

namespace tessel::nn {

struct MoeConfig {
  int64_t num_experts = 8;   // Hugging Face: num_local_experts
  int64_t top_k = 2;         // num_experts_per_tok
  int64_t expert_hidden = 0;  // each expert's SwiGLU width (Mixtral: intermediate_size)
  std::string scores = "softmax";
  bool renormalize = true;       // norm_topk_prob (Mixtral always renormalises)
  double capacity_factor = 0;    // 0: dropless
  double aux_loss_coef = 0.01;   // router_aux_loss_coef
  double z_loss_coef = 0;        // router_z_loss_coef (ST-MoE)
  int64_t shared_expert_hidden = 0;  // 0: no shared expert (Qwen2-MoE: shared_expert_intermediate_size)
};

// What the MoE blocks saw during a training step, summed over the micro-batches this rank ran;
// the engine adds the ranks' records up for the metrics.
struct MoeLayerStats {
  std::vector<double> tokens_per_expert;  // kept assignments per expert
  double assignments = 0, dropped = 0;    // before dropping; dropped by the capacity
  double aux_sum = 0, sequences = 0;      // Σ over sequences of the per-sequence balancing loss
  double z_sum = 0, tokens = 0;           // Σ over tokens of the z-loss term
};
struct MoeStep {
  // Factor of the auxiliary losses' gradients: the share of the step's loss one micro-batch is
  // (1/M with M micro-batches, as the pipeline scales the main loss).
  double loss_scale = 1;
  bool record = false;                     // collect stats (training steps)
  std::map<int64_t, MoeLayerStats> layers;  // by block index
};
// This rank's (thread's) step state.
MoeStep& moe_step();

// How a block's work is spread over ranks; set by the parallel layer (parallel/expert.h), null on
// one rank. The block computes on local pieces: `enter` turns the block's (distributed) input
// into this rank's sequences (whole, or its context-parallel part of each), `local` a parameter into its local piece,
// `leave` the local output (a partial sum over tensor-parallel ranks) back into a distributed tensor.
struct ExpertComm {
  int64_t ep = 1, ep_rank = 0;  // this rank holds experts [ep_rank · E/ep, (ep_rank + 1) · E/ep)
  // The router runs alike on every tensor-parallel rank, while its gradients are summed over
  // them (the experts' are partial there): its own gradients count 1/tp each.
  double router_share = 1;
  double batch_shards = 1;  // ranks the batch's sequences are split over: the losses' global means
  // Ranks each sequence is split over (context parallel), and the sum of a vector over them:
  // routing groups (sequences) span those ranks.
  int64_t seq_shards = 1;
  std::function<void(std::vector<double>&)> sum_over_seq;
  bool reports_stats = true;   // one rank of each tensor-parallel group records stats
  std::function<Tensor(const Tensor&)> enter, local;
  std::function<Tensor(const Tensor& y, const Tensor& x)> leave;  // x: the block's input
  // Sends consecutive blocks of send_rows[r] rows of x [n, C] to expert rank r; returns the
  // rows received, recv_rows[r] from rank r, in rank order. Differentiable.
  std::function<Tensor(const Tensor& x, const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows)>
      exchange;
  // Each rank sends counts[r·n, (r+1)·n) to rank r; returns what every rank sent here, by rank.
  std::function<std::vector<int64_t>(const std::vector<int64_t>& counts)> exchange_counts;
};

class MoeBlock : public Module {
 public:
  MoeBlock(int64_t dim, const MoeConfig& c, double init_std, int64_t layer);
  Tensor forward(const Tensor& x) const;  // [B, T, C] -> [B, T, C]
  const MoeConfig& config() const { return c_; }
  Linear& gate() { return *gate_; }
  Parameter& w1() { return *w1_; }
  Parameter& w2() { return *w2_; }
  Parameter& w3() { return *w3_; }
  std::shared_ptr<const ExpertComm> comm;

 private:
  MoeConfig c_;
  int64_t layer_;
  Linear* gate_;
  Parameter* w1_;
  Parameter* w2_;
  Parameter* w3_;
  SwiGlu* shared_ = nullptr;
};

// `y` unchanged; its backward also gives `loss` (a scalar) the gradient `scale`, as if
// scale · loss were added to the objective.
Tensor attach_loss(const Tensor& y, const Tensor& loss, double scale);

}  // namespace tessel::nn
