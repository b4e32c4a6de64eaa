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

int PipelineRuntime::peer_world_rank(int pp) const {
  return static_cast<int>(layout_.peer("pp", pp));
}

int PipelineRuntime::tag(int direction, int microbatch, int sender_vstage) const {
  return (direction * schedule_.microbatches + microbatch) * schedule_.virtual_stages() + sender_vstage;
}

Tensor PipelineRuntime::as_activation(const Tensor& t) const {
  const Placements act = layout_.activation_placements();
  return is_dist(t) && dist_attr(t).placements != act ? reshard(t, layout_.stage_mesh(), act) : t;
}

Tensor PipelineRuntime::receive(int pp, int tag) const {
  const ProcessMesh mesh = layout_.stage_mesh();
  const Placements act = layout_.activation_placements();
  Tensor buf = Tensor::empty(DistAttr(mesh, act).local_shape(activation_shape_, layout_.rank), dtype_);
  world_group()->recv(buf.raw_data(), buf.numel(), dtype_, peer_world_rank(pp), tag);
  return dtensor_from_local(buf, mesh, act, activation_shape_);
}

void PipelineRuntime::post(const Tensor& t, int pp, int tag, PendingSends& pending) const {
  const Tensor piece = view::contiguous(local_piece(t));
  WorkPtr w = world_group()->send_async(piece.raw_data(), piece.numel(), piece.dtype(), peer_world_rank(pp), tag);
  pending.emplace_back(std::move(w), piece);
}

double PipelineRuntime::run(const ChunkForward& forward) {
  const int M = schedule_.microbatches, V = schedule_.virtual_stages();
  const int me = static_cast<int>(layout_.coord("pp"));

  std::map<std::pair<int, int>, InFlight> live;  // (micro-batch, chunk)
  PendingSends pending_sends;
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
        } else {
          out = as_activation(out);
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
          const Tensor g = f.input.grad();
          f.grad_in = g.defined() ? as_activation(g)
                                  : dtensor_from_local(Tensor::zeros(local_piece(f.input).shape(), dtype_),
                                                       layout_.stage_mesh(), layout_.activation_placements(),
                                                       activation_shape_);
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
        post(fwd ? f.output : f.grad_in, a.peer, tag(fwd ? 0 : 1, a.microbatch, vs), pending_sends);
        if (!fwd) f.grad_in = Tensor();
        break;
      }
      case ActionKind::RECV_F:
      case ActionKind::RECV_B: {
        ProfileScope scope("(pipeline recv wait)");
        const bool fwd = a.kind == ActionKind::RECV_F;
        Tensor t = receive(a.peer, tag(fwd ? 0 : 1, a.microbatch, fwd ? vs - 1 : vs + 1));
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
  const int V = schedule_.virtual_stages(), me = static_cast<int>(layout_.coord("pp"));
  // In (micro-batch, virtual stage) order on every rank, what a receive waits for comes
  // earlier in that order on its sender, so the blocking receives cannot deadlock.
  PendingSends pending_sends;
  double loss_sum = 0;
  for (int m = 0; m < schedule_.microbatches; ++m)
    for (int c = 0; c < schedule_.chunks; ++c) {
      const int vs = schedule_.virtual_stage(me, c);
      const Tensor input = vs > 0 ? receive(schedule_.rank_of(vs - 1), tag(2, m, vs - 1)) : Tensor();
      const Tensor out = forward(c, m, input);
      if (vs == V - 1)
        loss_sum += local_piece(out).item();
      else
        post(as_activation(out), schedule_.rank_of(vs + 1), tag(2, m, vs), pending_sends);
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
