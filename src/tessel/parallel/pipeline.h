// The pipeline runtime: executes any valid Schedule (schedule.h) on this rank — forward and
// backward of its model chunks per micro-batch, and what crosses a stage boundary (a list of
// distributed tensors per micro-batch: the activations, and whatever else a model passes on, such
// as an auxiliary loss) sent with their gradients between pipeline ranks by the schedule's
// SEND/RECV actions, over the group of the world mesh's pp dim. Sends are posted asynchronously
// and waited for at the end of the step; receives are posted ahead, in schedule order, a few at a
// time, so a transfer lands while the rank computes and a RECV action only waits for what has
// not arrived yet. With one pipeline rank it is plain gradient accumulation over micro-batches.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tessel/comm/process_group.h"
#include "tessel/core/tensor.h"
#include "tessel/parallel/layout.h"
#include "tessel/parallel/schedule.h"

namespace tessel::parallel {

// One tensor of what crosses a stage boundary per micro-batch: its global shape, dtype and
// placements on the stage mesh.
struct Payload {
  Shape shape;
  DType dtype = DType::f32;
  Placements placements;
};

// One timed action of a step, for the timeline and the idle share.
struct ActionTiming {
  std::string name;  // Action::str()
  ActionKind kind;
  double start = 0, end = 0;  // seconds since the step began
};

class PipelineRuntime {
 public:
  // Runs model chunk `chunk` for micro-batch `microbatch` on `inputs` (empty on the first
  // virtual stage: the chunk reads its own token ids; else the previous stage's payload, in
  // order); the last virtual stage returns {the micro-batch's loss} (a replicated scalar), the
  // others the payload for the next stage.
  using ChunkForward = std::function<std::vector<Tensor>(int chunk, int microbatch, const std::vector<Tensor>& inputs)>;

  // `payload`: what crosses each stage boundary per micro-batch.
  PipelineRuntime(Schedule schedule, const Layout& layout, std::vector<Payload> payload);

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
  // A message's receive: the buffers of each payload tensor's piece and their works.
  struct Incoming {
    std::vector<Tensor> pieces;
    std::vector<WorkPtr> works;
  };
  // A message tag naming the direction (0 activations, 1 their gradients, 2 evaluation
  // activations), the micro-batch, the sending virtual stage and the payload tensor.
  int tag(int direction, int microbatch, int sender_vstage, size_t index) const;
  // `t` in the placements payload tensor `index` travels in.
  Tensor as_payload(const Tensor& t, size_t index) const;
  // Posts the receive of one micro-batch's payload (or its gradients) from pipeline rank `pp`.
  Incoming post_receive(int pp, int direction, int microbatch, int sender_vstage) const;
  // Waits for it and wraps the pieces as distributed tensors.
  std::vector<Tensor> finish_receive(Incoming&& in) const;
  // Posts this rank's pieces of `ts` to pipeline rank `pp`; they stay in `pending` (alive)
  // until their sends are waited for.
  void post(const std::vector<Tensor>& ts, int pp, int direction, int microbatch, int sender_vstage,
            PendingSends& pending) const;

  Schedule schedule_;
  const Layout& layout_;
  std::vector<Payload> payload_;
  std::shared_ptr<ProcessGroup> pp_group_;  // this rank's pipeline: group rank = pp coordinate
  std::vector<ActionTiming> timings_;
  double step_seconds_ = 0;
};

}  // namespace tessel::parallel
