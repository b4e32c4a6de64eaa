// The router of a mixture-of-experts layer (issue 29): which experts each token goes to, with
// which weights, which assignments a capacity drops, and the two regularising losses. Written
// with tessel's ops, so the weights and the losses are differentiable with respect to the
// router's logits (and through them, its weight) in every layout the ops support.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessel/core/tensor.h"

namespace tessel::nn {

struct RouterOptions {
  int64_t top_k = 2;
  std::string scores = "softmax";  // softmax | sigmoid (over each token's expert logits)
  bool renormalize = true;         // the k weights of a token divided by their sum
  // 0: dropless. > 0: each expert takes at most ceil(capacity_factor · G · k / E) assignments
  // of each group of G tokens; the ones beyond it are dropped, lowest score first (ties: the
  // later token).
  double capacity_factor = 0;
  // Tokens per routing group (0: all T tokens are one group). The capacity and the load-balancing
  // loss are per group, the loss averaged over the groups. A model routes each sequence as a
  // group, so what is dropped and the loss do not depend on how the batch is split over ranks
  // or micro-batches.
  int64_t group_tokens = 0;
  // Ranks each group's tokens are spread over (context parallel: every rank holds 1/shards of
  // each sequence, group_tokens of them here), and how to add a vector up over those ranks. The
  // assignment shares f then count the whole group, and the balancing loss returned is this
  // rank's part of the group's, E · Σ_e f_e · (this rank's scores of e) / (G · shards): the parts
  // add up over the ranks to the group's loss. Dropless only (a capacity would rank a group's
  // assignments across ranks).
  int64_t group_shards = 1;
  std::function<void(std::vector<double>&)> sum_over_shards;
};

struct Routing {
  Tensor weights;  // [T, k], differentiable: the weight of each token's j-th expert (0 if dropped)
  Tensor experts;  // [T, k] i64: the j-th expert of each token, best score first
  // The kept assignments (t·k + j) sorted by expert, tokens in order within an expert: the
  // rows a grouped GEMM receives, `counts[e]` of them for expert e.
  std::vector<int64_t> order, counts;
  int64_t dropped = 0;         // assignments dropped by the capacity
  double dropped_fraction = 0;  // dropped / (T · k)
  // Switch/GShard load balancing, E · Σ_e f_e · P_e: f_e the share of the G·k assignments of a
  // group (before dropping) that chose expert e (not differentiated), P_e the mean score of
  // expert e over the group's tokens; the mean over the groups. 1 for a perfectly balanced
  // router. Scalar, differentiable.
  Tensor aux_loss;
  // ST-MoE's router z-loss: the mean over tokens of logsumexp(logits)². Scalar, differentiable.
  Tensor z_loss;
};

// Routes the tokens of `logits` [T, E] (the router linear's output). Throws naming the option
// on k outside 1..E, an unknown score function, a negative capacity factor, or a capacity with
// groups spread over ranks.
Routing route_tokens(const Tensor& logits, const RouterOptions& options);

}  // namespace tessel::nn
