// The pipeline runtime: executes any valid Schedule (schedule.h) on this rank — forward and
// backward of its model chunks per micro-batch, and the activations and their gradients sent
// between pipeline ranks by the schedule's SEND/RECV actions (sends are posted asynchronously
// and waited for at the end of the step; receives block). With one pipeline rank it is plain
// gradient accumulation over micro-batches.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tessel/comm/process_group.h"
#include "tessel/core/tensor.h"
#include "tessel/parallel/layout.h"
#include "tessel/parallel/schedule.h"

namespace tessel::parallel {

// One timed action of a step, for the timeline and the idle share.
struct ActionTiming {
  std::string name;  // Action::str()
  ActionKind kind;
  double start = 0, end = 0;  // seconds since the step began
};

class PipelineRuntime {
 public:
  // Runs model chunk `chunk` for micro-batch `microbatch` on `x` (undefined on the first
  // virtual stage: the chunk reads its own token ids); the last virtual stage returns the
  // micro-batch's loss (a replicated scalar), the others their output activations.
  using ChunkForward = std::function<Tensor(int chunk, int microbatch, const Tensor& x)>;

  // `activation_shape`: the global shape of a micro-batch's activations between stages.
  PipelineRuntime(Schedule schedule, const Layout& layout, Shape activation_shape, DType dtype);

  // One training step's forward and backward over every micro-batch; parameter gradients
  // accumulate in .grad. Returns the sum of the micro-batch losses on ranks holding the last
  // virtual stage, 0 elsewhere. Each micro-batch's loss is scaled by 1/microbatches before its
  // backward (the mean over micro-batches, as gradient accumulation does on one rank).
  double run(const ChunkForward& forward);

  // Forward only, for evaluation, with no gradients recorded: every micro-batch through this
  // rank's chunks in virtual-stage order, each activation sent on to the next virtual stage as
  // soon as it is made. Returns the sum of the micro-batch losses on ranks holding the last
  // virtual stage, 0 elsewhere.
  double evaluate(const ChunkForward& forward);

  const Schedule& schedule() const { return schedule_; }
  // The last step's actions on this rank, in order.
  const std::vector<ActionTiming>& timings() const { return timings_; }
  // 1 - (time in F, B and W) / (step time) for the last step.
  double idle_share() const;

 private:
  using PendingSends = std::vector<std::pair<WorkPtr, Tensor>>;
  // The world rank of pipeline rank `pp` in this rank's (dp, tp) position.
  int peer_world_rank(int pp) const;
  // A message tag naming the direction (0 activations, 1 their gradients, 2 evaluation
  // activations), the micro-batch and the sending virtual stage.
  int tag(int direction, int microbatch, int sender_vstage) const;
  // `t` in the placements activations travel in between stages.
  Tensor as_activation(const Tensor& t) const;
  // Receives one micro-batch's activation (or its gradient) from pipeline rank `pp`.
  Tensor receive(int pp, int tag) const;
  // Posts this rank's piece of `t` to pipeline rank `pp`; the piece stays in `pending` (alive)
  // until its send is waited for.
  void post(const Tensor& t, int pp, int tag, PendingSends& pending) const;

  Schedule schedule_;
  const Layout& layout_;
  Shape activation_shape_;
  DType dtype_;
  std::vector<ActionTiming> timings_;
  double step_seconds_ = 0;
};

}  // namespace tessel::parallel
