// The pipeline runtime.
#include "tessel/parallel/pipeline.h"

#include <chrono>
#include <map>

#include "tessel/autograd/engine.h"
#include "tessel/comm/world.h"
#include "tessel/core/context.h"
#include "tessel/core/error.h"
#include "tessel/core/profile.h"
#include "tessel/core/view.h"
#include "tessel/dist/dtensor.h"
#include "tessel/ops/ops.h"

namespace tessel::parallel {

namespace {

using Clock = std::chrono::steady_clock;

// The state of one (micro-batch, chunk) between its F and its B/W.
struct InFlight {
  Tensor input;   // the received activation (a leaf), undefined on the first virtual stage
  Tensor output;  // activations, or the scaled loss on the last virtual stage
  Tensor grad_in;  // the input's gradient, made by B, sent by SEND_B
  Tensor grad_out;  // the output's gradient, received by RECV_B
  DeferredWeightGrads deferred;  // ZB: the W half of the backward
  bool b_done = false, w_done = false;
};

}  // namespace

PipelineRuntime::PipelineRuntime(Schedule schedule, const Layout& layout, Shape activation_shape, DType dtype)
    : schedule_(std::move(schedule)), layout_(layout), activation_shape_(std::move(activation_shape)), dtype_(dtype) {
  TESSEL_CHECK(schedule_.stages == layout_.config().pp, "pipeline: schedule for {} stages on {} pipeline ranks",
               schedule_.stages, layout_.config().pp);
  validate(schedule_);
}

Shape PipelineRuntime::local_activation_shape() const {
  return DistAttr(layout_.stage_mesh(), layout_.activation_placements()).local_shape(activation_shape_, layout_.rank);
}

int PipelineRuntime::peer_world_rank(int pp) const {
  return static_cast<int>(layout_.world_rank(pp, layout_.dp_rank, layout_.tp_rank));
}

int PipelineRuntime::tag(int direction, int microbatch, int sender_vstage) const {
  return (direction * schedule_.microbatches + microbatch) * schedule_.virtual_stages() + sender_vstage;
}

double PipelineRuntime::run(const ChunkForward& forward) {
  const int M = schedule_.microbatches, V = schedule_.virtual_stages();
  const int me = static_cast<int>(layout_.pp_rank);
  const ProcessMesh mesh = layout_.stage_mesh();
  const Placements act = layout_.activation_placements();
  const Shape local_shape = local_activation_shape();
  auto world = world_group();

  std::map<std::pair<int, int>, InFlight> live;  // (micro-batch, chunk)
  std::vector<std::pair<WorkPtr, Tensor>> pending_sends;
  timings_.clear();
  double loss_sum = 0;
  const auto t0 = Clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };

  for (const Action& a : schedule_.ranks[static_cast<size_t>(me)]) {
    const int vs = schedule_.virtual_stage(me, a.chunk);
    InFlight& f = live[{a.microbatch, a.chunk}];
    const double start = seconds();
    switch (a.kind) {
      case ActionKind::F: {
        ProfileScope scope("(pipeline forward)");
        Tensor out = forward(a.chunk, a.microbatch, f.input);
        if (vs == V - 1) {
          loss_sum += local_piece(out).item();
          out = M == 1 ? out : scale(out, 1.0 / static_cast<double>(M));
        } else if (is_dist(out) && dist_attr(out).placements != act) {
          out = reshard(out, mesh, act);
        }
        f.output = out;
        break;
      }
      case ActionKind::B: {
        ProfileScope scope("(pipeline backward)");
        std::vector<Tensor> grads{vs == V - 1 ? Tensor() : f.grad_out};
        std::vector<Tensor> inputs;
        if (f.input.defined()) inputs.push_back(f.input);
        if (schedule_.split_backward) f.deferred = backward_inputs({f.output}, grads, inputs);
        else backward({f.output}, grads);
        if (f.input.defined()) {
          Tensor g = f.input.grad();
          if (!g.defined()) g = dtensor_from_local(Tensor::zeros(local_shape, dtype_), mesh, act, activation_shape_);
          else if (dist_attr(g).placements != act) g = reshard(g, mesh, act);
          f.grad_in = g;
        }
        f.output = Tensor();
        f.grad_out = Tensor();
        f.b_done = true;
        break;
      }
      case ActionKind::W: {
        ProfileScope scope("(pipeline backward weights)");
        backward_weights(std::move(f.deferred));
        f.w_done = true;
        break;
      }
      case ActionKind::SEND_F:
      case ActionKind::SEND_B: {
        const bool fwd = a.kind == ActionKind::SEND_F;
        // Kept alive (in pending_sends) until the send completes.
        const Tensor t = view::contiguous(local_piece(fwd ? f.output : f.grad_in));
        WorkPtr w = world->send_async(t.raw_data(), t.numel(), t.dtype(), peer_world_rank(a.peer),
                                      tag(fwd ? 0 : 1, a.microbatch, vs));
        pending_sends.emplace_back(std::move(w), t);
        if (!fwd) f.grad_in = Tensor();
        break;
      }
      case ActionKind::RECV_F:
      case ActionKind::RECV_B: {
        ProfileScope scope("(pipeline recv wait)");
        const bool fwd = a.kind == ActionKind::RECV_F;
        Tensor buf = Tensor::empty(local_shape, dtype_);
        world->recv(buf.raw_data(), buf.numel(), dtype_, peer_world_rank(a.peer),
                    tag(fwd ? 0 : 1, a.microbatch, fwd ? vs - 1 : vs + 1));
        Tensor t = dtensor_from_local(buf, mesh, act, activation_shape_);
        if (fwd) {
          t.set_requires_grad(true);
          f.input = t;
        } else {
          f.grad_out = t;
        }
        break;
      }
    }
    timings_.push_back({a.str(), a.kind, start, seconds()});
    // Done with this (micro-batch, chunk): drop what it held.
    if (f.b_done && !f.grad_in.defined() && (f.w_done || !schedule_.split_backward)) live.erase({a.microbatch, a.chunk});
  }
  {
    ProfileScope scope("(pipeline send wait)");
    for (auto& [w, t] : pending_sends) w->wait();
  }
  step_seconds_ = seconds();
  return loss_sum;
}

double PipelineRuntime::evaluate(const ChunkForward& forward) {
  NoGradGuard no_grad;
  ProfileScope scope("(pipeline evaluation)");
  const int V = schedule_.virtual_stages(), me = static_cast<int>(layout_.pp_rank);
  const ProcessMesh mesh = layout_.stage_mesh();
  const Placements act = layout_.activation_placements();
  const Shape local_shape = local_activation_shape();
  auto world = world_group();
  // In (micro-batch, virtual stage) order on every rank, what a receive waits for comes
  // earlier in that order on its sender, so the blocking receives cannot deadlock.
  std::vector<std::pair<WorkPtr, Tensor>> pending_sends;
  double loss_sum = 0;
  for (int m = 0; m < schedule_.microbatches; ++m)
    for (int c = 0; c < schedule_.chunks; ++c) {
      const int vs = schedule_.virtual_stage(me, c);
      Tensor input;
      if (vs > 0) {
        Tensor buf = Tensor::empty(local_shape, dtype_);
        world->recv(buf.raw_data(), buf.numel(), dtype_, peer_world_rank(schedule_.rank_of(vs - 1)), tag(2, m, vs - 1));
        input = dtensor_from_local(buf, mesh, act, activation_shape_);
      }
      Tensor out = forward(c, m, input);
      if (vs == V - 1) {
        loss_sum += local_piece(out).item();
        continue;
      }
      if (is_dist(out) && dist_attr(out).placements != act) out = reshard(out, mesh, act);
      const Tensor t = view::contiguous(local_piece(out));
      pending_sends.emplace_back(world->send_async(t.raw_data(), t.numel(), t.dtype(),
                                                   peer_world_rank(schedule_.rank_of(vs + 1)), tag(2, m, vs)),
                                 t);
    }
  for (auto& [w, t] : pending_sends) w->wait();
  return loss_sum;
}

double PipelineRuntime::idle_share() const {
  if (step_seconds_ <= 0) return 0;
  double busy = 0;
  for (const ActionTiming& t : timings_)
    if (t.kind == ActionKind::F || t.kind == ActionKind::B || t.kind == ActionKind::W) busy += t.end - t.start;
  return 1.0 - busy / step_seconds_;
}

}  // namespace tessel::parallel
