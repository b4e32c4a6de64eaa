// shard_optimizer: AdamW or SGD over distributed parameters, with data parallelism and ZeRO
// sharding over the mesh dim "dp" (Rajbhandari et al. 2020). Every piece of training state is
// a distributed tensor whose placements say how it is split — a ZeRO shard is Shard(d) over dp
// (d = the first dim tp does not split; uneven pieces allowed), never a flat slice:
//   stage 0 — gradients all-reduced over dp; parameters and optimizer states replicated.
//   stage 1 — optimizer states Shard(d) over dp; the gradients, summed over the micro-batches
//             first, are reduce-scattered onto those shards; each rank updates its shard of the
//             parameter, then the shards are all-gathered.
//   stage 2 — as 1, but each micro-batch's gradients are reduce-scattered as the backward
//             produces them and added into a gradient shard; the full-size gradients of a
//             bucket are freed as soon as it is packed, so at most a bucket or two of them live.
//   stage 3 — parameters are stored Shard(d) over dp too (parallelize gathers them just before
//             use; the gather's backward reduce-scatters their gradients).
// Gradient sync runs from the autograd engine's grad-ready hooks (a parameter's gradient is
// complete for a backward): gradients are packed into buckets of `bucket_bytes` in the order
// they become ready and each bucket's collective is launched asynchronously, so it overlaps the
// rest of the backward; step() waits only for what is still in flight. A gradient may also be
// a partial sum over one more mesh dim the batch is split over: cp (context parallel, every
// parameter) or ep (expert parallel, the parameters replicated over it — attention, norms,
// router, embeddings). Such gradients go in buckets of their own, and a bucket, once reduced
// over dp, is summed over that dim by one more asynchronous all_reduce (of this rank's
// reduce-scattered part under ZeRO), which runs while the next bucket is reduced over dp. Over tp (and across
// pipeline stages for a tied parameter) gradients are made to match their parameter's layout.
// Global-norm clipping counts every element once across all shards, replicas and stages
// (torch.nn.utils.clip_grad_norm_ semantics). See docs/parallel.md.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "tessel/comm/process_group.h"
#include "tessel/nn/module.h"
#include "tessel/optim/optimizer.h"
#include "tessel/parallel/layout.h"

namespace tessel::parallel {

struct OptimizerOptions {
  std::string kind = "adamw";  // adamw | sgd
  optim::AdamWOptions adamw;
  optim::SgdOptions sgd;
  // Gradient bytes per collective during the backward (docs/parallel.md, "Gradient buckets").
  int64_t bucket_bytes = int64_t{4} << 20;
  // The dtype gradient buckets are summed in over dp (and cp/ep): f32, or bf16 (train.grad_reduce:
  // half the bytes; the f32 gradients are rounded into the bucket and widened back after).
  DType reduce_dtype = DType::f32;
};

class ShardedOptimizer {
 public:
  // `tied`: parameters this rank shares with another pipeline rank (GPT-2's token embedding,
  // used by the first and the last stage), whose gradients are summed over `tied_group`;
  // `count_tied` says whether this rank's copy counts for the gradient norm. Installs the
  // gradient hooks on every parameter; `micro_batches` backwards make one step.
  ShardedOptimizer(std::vector<nn::Parameter*> params, const Layout& layout, OptimizerOptions options,
                   std::vector<nn::Parameter*> tied = {}, std::shared_ptr<ProcessGroup> tied_group = nullptr,
                   bool count_tied = true);
  ~ShardedOptimizer();
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  // Finishes the gradient sync the backward started, clips to `max_norm` (≤ 0: no clipping),
  // updates every parameter with learning rate `lr`, and drops the gradients. Returns the
  // global gradient norm (before clipping).
  double step(double lr, double max_norm);

  // The optimizer state by name ("<parameter>.exp_avg", ".exp_avg_sq" or ".momentum_buffer"):
  // distributed tensors with the placements of the ZeRO shard, and "step".
  std::map<std::string, Tensor> state() const;
  // Sets the number of updates applied so far (AdamW's bias correction), after the states were
  // read from a checkpoint into state()'s tensors.
  void restore_steps(int64_t steps);
  int64_t steps() const { return steps_; }
  // The placements each parameter's optimizer state and synced gradient have (its ZeRO shard).
  Placements shard_placements(const std::string& param) const;

  // A span this rank spent blocked on the optimizer's communication: waiting for a gradient
  // bucket, or in a collective of the step (the exposed, not overlapped, part of the sync).
  struct Wait {
    std::string what;
    std::chrono::steady_clock::time_point start, end;
  };
  // The waits since the last call, oldest first.
  std::vector<Wait> take_waits() { return std::exchange(waits_, {}); }

  // ZeRO stage 3: the gradient of a parameter's gathered (full over dp) weight, as a unit's
  // backward produces it (ParamGather's grad sink). It goes into the bucket being filled and
  // is reduce-scattered onto the dp shards with the rest of the bucket, asynchronously, while
  // the backward goes on; `step()` waits for what is still in flight. False when `p` is not
  // one this optimizer reduces that way (the caller then reshards it itself).
  bool accept_gathered_grad(const nn::Parameter* p, const Tensor& grad);

 private:
  struct Slot;
  struct Bucket;
  void on_ready(size_t slot);
  void enqueue(size_t slot);  // into the bucket being filled
  void enqueue_grad(size_t slot, Tensor grad);
  void launch(Bucket&& bucket);
  void finish_oldest();      // its dp collective; then its sum over cp / ep goes in flight, or it is unpacked
  void start_sum(Bucket& bucket);  // the all_reduce over its next sum dim
  void finish_oldest_sum();        // that sum (and the next dim's), then unpacked
  void unpack_bucket(Bucket& bucket);
  void update(size_t slot, float clip, double lr);
  // Runs `fn` (a blocking collective) and records the time as a Wait called `what`.
  template <typename F>
  void timed(const char* what, F&& fn);

  std::vector<Slot> slots_;
  std::vector<Bucket> in_flight_;      // reducing over dp
  std::vector<Bucket> sum_in_flight_;  // summing over cp and/or ep
  // The buckets being filled, by the mesh dims their gradients owe a sum over (none, cp, ep or both).
  std::map<std::vector<int64_t>, std::unique_ptr<Bucket>> filling_;
  std::map<int64_t, std::shared_ptr<ProcessGroup>> sum_groups_;  // the groups of those dims
  const Layout& layout_;
  OptimizerOptions options_;
  std::shared_ptr<ProcessGroup> tied_group_;
  bool count_tied_;
  int64_t steps_ = 0;
  std::vector<Wait> waits_;
};

}  // namespace tessel::parallel
