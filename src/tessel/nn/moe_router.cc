// The MoE router (moe_router.h): scores, top-k, renormalisation, capacity, and the auxiliary
// and z losses, all from tessel's ops; the choices themselves (which experts, which are
// dropped) are integer decisions made from the scores' values.
#include "tessel/nn/moe_router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tessel/core/context.h"
#include "tessel/core/error.h"
#include "tessel/core/view.h"
#include "tessel/ops/ops.h"

namespace tessel::nn {

Routing route_tokens(const Tensor& logits, const RouterOptions& o) {
  TESSEL_CHECK(logits.dim() == 2, "moe router: logits must be [tokens, experts], got {}", shape_str(logits.shape()));
  const int64_t T = logits.size(0), E = logits.size(1), k = o.top_k;
  TESSEL_CHECK(k >= 1 && k <= E, "moe router: top_k = {} must be 1..{} (the number of experts)", k, E);
  TESSEL_CHECK(o.scores == "softmax" || o.scores == "sigmoid", "moe router: scores '{}' is not softmax or sigmoid",
               o.scores);
  TESSEL_CHECK(std::isfinite(o.capacity_factor) && o.capacity_factor >= 0,
               "moe router: capacity_factor {} must be 0 (dropless) or positive", o.capacity_factor);
  TESSEL_CHECK(o.group_shards >= 1 && (o.group_shards == 1 || o.sum_over_shards),
               "moe router: group_shards = {} needs a sum over the shards", o.group_shards);
  TESSEL_CHECK(o.group_shards == 1 || o.capacity_factor == 0,
               "moe router: a capacity (capacity_factor {}) ranks each group's assignments together, but the group is "
               "spread over {} ranks (context parallel); only dropless routing splits",
               o.capacity_factor, o.group_shards);
  Routing r;
  // sigmoid(x) = 1 / (1 + exp(-x)).
  const Tensor scores = o.scores == "softmax" ? softmax(logits, -1) : div(Tensor::full({1}, 1.0, logits.dtype()),
                                                                        scale(exp(neg(logits)), 1.0, 1.0));
  auto [top, experts] = topk(scores, k, -1, true);
  r.experts = experts;
  Tensor weights = o.renormalize ? div(top, sum(top, {1}, true)) : top;

  // Groups of G tokens: capacity per (group, expert), the balancing loss per group.
  const int64_t G = o.group_tokens > 0 ? o.group_tokens : T, groups = T > 0 ? T / G : 0;
  TESSEL_CHECK(o.group_tokens >= 0 && (T == 0 || T % G == 0),
               "moe router: {} tokens do not split into routing groups of {}", T, o.group_tokens);
  // In meta mode (a traced step: shapes, no values) the choices are those of a perfectly
  // balanced router — assignment a goes to expert a mod E, so every expert gets T·k/E of them
  // and a token's k choices are k different experts — with equal scores: what a router the
  // balancing loss keeps even does on average. The planner models the imbalance apart. Only
  // the counts are worked out then (no assignment lists: `order` stays empty).
  const bool meta = meta_mode();
  const int64_t capacity =
      o.capacity_factor > 0
          ? static_cast<int64_t>(std::ceil(o.capacity_factor * static_cast<double>(G * k) / static_cast<double>(E)))
          : G * k;
  std::vector<double> chose(static_cast<size_t>(groups * E), 0.0);  // each group's assignments per expert
  r.counts.assign(static_cast<size_t>(E), 0);
  std::vector<double> keep;
  if (meta) {
    const int64_t N = G * k;  // a group's assignments, a0 = g·N, …: expert e gets those with a ≡ e mod E
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t e = 0; e < E; ++e) {
        const int64_t n = N / E + (((e - g * N) % E + E) % E < N % E ? 1 : 0);
        chose[static_cast<size_t>(g * E + e)] = static_cast<double>(n);
        r.counts[static_cast<size_t>(e)] += std::min(n, capacity);
        r.dropped += std::max<int64_t>(n - capacity, 0);
      }
  } else {
    // The dispatch order is host control flow: decided on host copies of the choices.
    const std::vector<int64_t> pe = experts.to_vector<int64_t>();
    const std::vector<double> sv = view::contiguous(top).to_doubles();
    keep.assign(static_cast<size_t>(T * k), 1.0);
    std::vector<std::vector<int64_t>> kept(static_cast<size_t>(E));  // per expert, in token order
    for (int64_t g = 0; g < groups; ++g) {
      // Per expert, the group's assignments; those past the capacity dropped by score (best
      // first, ties to the earlier token).
      std::vector<std::vector<int64_t>> chosen(static_cast<size_t>(E));
      for (int64_t a = g * G * k; a < (g + 1) * G * k; ++a) chosen[static_cast<size_t>(pe[a])].push_back(a);
      for (int64_t e = 0; e < E; ++e) {
        std::vector<int64_t>& list = chosen[static_cast<size_t>(e)];
        chose[static_cast<size_t>(g * E + e)] = static_cast<double>(list.size());
        if (static_cast<int64_t>(list.size()) > capacity) {
          std::vector<int64_t> by_score = list;
          std::stable_sort(by_score.begin(), by_score.end(), [&](int64_t a, int64_t b) {
            return sv[static_cast<size_t>(a)] > sv[static_cast<size_t>(b)];
          });
          for (size_t i = static_cast<size_t>(capacity); i < by_score.size(); ++i)
            keep[static_cast<size_t>(by_score[i])] = 0;
          r.dropped += static_cast<int64_t>(by_score.size()) - capacity;
        }
        for (int64_t a : list)
          if (keep[static_cast<size_t>(a)] != 0) kept[static_cast<size_t>(e)].push_back(a);
      }
    }
    for (int64_t e = 0; e < E; ++e) {
      r.counts[static_cast<size_t>(e)] = static_cast<int64_t>(kept[static_cast<size_t>(e)].size());
      r.order.insert(r.order.end(), kept[static_cast<size_t>(e)].begin(), kept[static_cast<size_t>(e)].end());
    }
  }
  r.dropped_fraction = T * k > 0 ? static_cast<double>(r.dropped) / static_cast<double>(T * k) : 0.0;
  if (r.dropped > 0) {
    DeviceScope on(weights.device());
    Tensor mask = meta ? Tensor::empty({T, k}, DType::f64) : Tensor::from_vector(keep, {T, k});
    weights = mul(weights, cast(mask, weights.dtype()));
  }
  r.weights = weights;

  // aux = mean over groups of E · Σ_e f_ge · P_ge; f from the choices before dropping, as
  // Switch counts them, over the whole group (every shard of it); P this rank's part of the
  // group's mean score.
  if (o.group_shards > 1) o.sum_over_shards(chose);
  const auto whole = static_cast<double>(G * o.group_shards);
  std::vector<double> fv(chose.size());
  for (size_t i = 0; i < chose.size(); ++i) fv[i] = chose[i] / (whole * static_cast<double>(k));
  DeviceScope on_scores(scores.device());
  Tensor f = meta ? Tensor::empty({groups, E}, DType::f64) : Tensor::from_vector(fv, {groups, E});
  const Tensor per_group = reshape(scores, {groups, G, E});
  const Tensor P = o.group_shards == 1 ? mean(per_group, {1}) : scale(sum(per_group, {1}), 1.0 / whole);
  r.aux_loss = scale(mean(sum(mul(P, cast(f, P.dtype())), {1})), static_cast<double>(E));
  // z = mean_t (logsumexp_t)², logsumexp = m + log Σ exp(x - m) with m the row maximum.
  const Tensor m = max(logits, {1}, true);
  const Tensor lse = add(m, log(sum(exp(sub(logits, m)), {1}, true)));
  r.z_loss = mean(mul(lse, lse));
  return r;
}

}  // namespace tessel::nn
