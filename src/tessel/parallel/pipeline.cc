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
#include "tessel/dist/comm_buffers.h"
#include "tessel/dist/dtensor.h"
#include "tessel/ops/ops.h"

namespace tessel::parallel {

namespace {

using Clock = std::chrono::steady_clock;

// Receives posted ahead of their RECV action, in schedule order.
constexpr size_t kReceivesAhead = 2;

// The state of one (micro-batch, chunk) between its F and its B/W.
struct InFlight {
  std::vector<Tensor> inputs;     // the received payload (leaves), empty on the first virtual stage
  std::vector<Tensor> outputs;    // the payload made, or {the scaled loss} on the last virtual stage
  std::vector<Tensor> grad_in;    // the inputs' gradients, made by B, sent by SEND_B
  std::vector<Tensor> grad_out;   // the outputs' gradients, received by RECV_B
  DeferredWeightGrads deferred;   // ZB: the W half of the backward
  bool b_done = false, w_done = false;
};

}  // namespace

PipelineRuntime::PipelineRuntime(Schedule schedule, const Layout& layout, std::vector<Payload> payload)
    : schedule_(std::move(schedule)), layout_(layout), payload_(std::move(payload)) {
  TESSEL_CHECK(schedule_.stages == layout_.config().pp, "pipeline: schedule for {} stages on {} pipeline ranks",
               schedule_.stages, layout_.config().pp);
  TESSEL_CHECK(!payload_.empty(), "pipeline: nothing crosses the stage boundaries (an empty payload)");
  const int64_t mesh_dims = layout_.stage_mesh().ndim();
  for (size_t i = 0; i < payload_.size(); ++i)
    TESSEL_CHECK(static_cast<int64_t>(payload_[i].placements.size()) == mesh_dims,
                 "pipeline: payload tensor {} has {} placements for a stage mesh of {} dims", i,
                 payload_[i].placements.size(), mesh_dims);
  validate(schedule_);
  if (layout_.config().pp > 1) pp_group_ = layout_.world_group_along("pp");
}

int PipelineRuntime::tag(int direction, int microbatch, int sender_vstage, size_t index) const {
  const int n = static_cast<int>(payload_.size());
  return ((direction * schedule_.microbatches + microbatch) * schedule_.virtual_stages() + sender_vstage) * n +
         static_cast<int>(index);
}

Tensor PipelineRuntime::as_payload(const Tensor& t, size_t index) const {
  const Payload& p = payload_[index];
  TESSEL_CHECK(t.shape() == p.shape, "pipeline: payload tensor {} has shape {}, but {} was declared", index,
               shape_str(t.shape()), shape_str(p.shape));
  if (!is_dist(t)) return dtensor_from_local(t, layout_.stage_mesh(), layout_.placements({}), p.shape);
  return dist_attr(t).placements != p.placements ? reshard(t, layout_.stage_mesh(), p.placements) : t;
}

PipelineRuntime::Incoming PipelineRuntime::post_receive(int pp, int direction, int microbatch, int sender_vstage) const {
  const ProcessMesh mesh = layout_.stage_mesh();
  Incoming in;
  for (size_t i = 0; i < payload_.size(); ++i) {
    const Payload& p = payload_[i];
    Tensor buf = Tensor::empty(DistAttr(mesh, p.placements).local_shape(p.shape, layout_.rank), p.dtype);
    CommBuffers cb;
    in.works.push_back(cb.finish(pp_group_->recv_async(cb.out(buf), buf.numel(), p.dtype, pp,
                                                       tag(direction, microbatch, sender_vstage, i))));
    in.pieces.push_back(std::move(buf));
  }
  return in;
}

std::vector<Tensor> PipelineRuntime::finish_receive(Incoming&& in) const {
  const ProcessMesh mesh = layout_.stage_mesh();
  std::vector<Tensor> out;
  for (size_t i = 0; i < payload_.size(); ++i) {
    in.works[i]->wait();
    out.push_back(dtensor_from_local(in.pieces[i], mesh, payload_[i].placements, payload_[i].shape));
  }
  return out;
}

void PipelineRuntime::post(const std::vector<Tensor>& ts, int pp, int direction, int microbatch, int sender_vstage,
                           PendingSends& pending) const {
  TESSEL_ASSERT(ts.size() == payload_.size(), "pipeline: {} tensors to send, payload of {}", ts.size(), payload_.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor piece = view::contiguous(local_piece(ts[i]));
    CommBuffers cb;
    WorkPtr w = cb.finish(pp_group_->send_async(cb.in(piece), piece.numel(), piece.dtype(), pp,
                                                tag(direction, microbatch, sender_vstage, i)));
    pending.emplace_back(std::move(w), piece);
  }
}

double PipelineRuntime::run(const ChunkForward& forward) {
  const int M = schedule_.microbatches, V = schedule_.virtual_stages();
  const int me = static_cast<int>(layout_.coord("pp"));
  const std::vector<Action>& actions = schedule_.ranks[static_cast<size_t>(me)];

  std::map<std::pair<int, int>, InFlight> live;  // (micro-batch, chunk)
  PendingSends pending_sends;
  timings_.clear();
  double loss_sum = 0;
  const auto t0 = Clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };

  // This rank's receives in schedule order, posted kReceivesAhead ahead of the one waited for.
  std::vector<const Action*> receives;
  for (const Action& a : actions)
    if (a.kind == ActionKind::RECV_F || a.kind == ActionKind::RECV_B) receives.push_back(&a);
  std::map<size_t, Incoming> posted;
  size_t next_post = 0, next_wait = 0;
  auto post_ahead = [&] {
    for (; next_post < receives.size() && next_post < next_wait + kReceivesAhead; ++next_post) {
      const Action& r = *receives[next_post];
      const int vs = schedule_.virtual_stage(me, r.chunk);
      const bool fwd = r.kind == ActionKind::RECV_F;
      posted[next_post] = post_receive(r.peer, fwd ? 0 : 1, r.microbatch, fwd ? vs - 1 : vs + 1);
    }
  };
  post_ahead();

  for (const Action& a : actions) {
    const int vs = schedule_.virtual_stage(me, a.chunk);
    InFlight& f = live[{a.microbatch, a.chunk}];
    const double start = seconds();
    switch (a.kind) {
      case ActionKind::F: {
        ProfileScope scope("(pipeline forward)");
        std::vector<Tensor> out = forward(a.chunk, a.microbatch, f.inputs);
        if (vs == V - 1) {
          TESSEL_CHECK(out.size() == 1, "pipeline: the last stage returns the loss alone, not {} tensors", out.size());
          loss_sum += local_piece(out[0]).item();
          if (M > 1) out[0] = scale(out[0], 1.0 / static_cast<double>(M));
        } else {
          TESSEL_CHECK(out.size() == payload_.size(), "pipeline: virtual stage {} returned {} tensors for a payload of {}",
                       vs, out.size(), payload_.size());
          for (size_t i = 0; i < out.size(); ++i) out[i] = as_payload(out[i], i);
        }
        f.outputs = std::move(out);
        break;
      }
      case ActionKind::B: {
        ProfileScope scope("(pipeline backward)");
        std::vector<Tensor> roots, grads;
        for (size_t i = 0; i < f.outputs.size(); ++i) {
          if (!f.outputs[i].requires_grad()) continue;  // a payload tensor no parameter made
          roots.push_back(f.outputs[i]);
          grads.push_back(vs == V - 1 ? Tensor() : f.grad_out[i]);
        }
        if (schedule_.split_backward) f.deferred = backward_inputs(roots, grads, f.inputs);
        else if (!roots.empty()) backward(roots, grads);
        for (size_t i = 0; i < f.inputs.size(); ++i) {
          const Tensor g = f.inputs[i].grad();
          const Payload& p = payload_[i];
          f.grad_in.push_back(g.defined() ? as_payload(g, i)
                                          : dtensor_from_local(Tensor::zeros(local_piece(f.inputs[i]).shape(), p.dtype),
                                                               layout_.stage_mesh(), p.placements, p.shape));
        }
        f.outputs.clear();
        f.grad_out.clear();
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
        post(fwd ? f.outputs : f.grad_in, a.peer, fwd ? 0 : 1, a.microbatch, vs, pending_sends);
        if (!fwd) f.grad_in.clear();
        break;
      }
      case ActionKind::RECV_F:
      case ActionKind::RECV_B: {
        ProfileScope scope("(pipeline recv wait)");
        post_ahead();
        auto it = posted.find(next_wait);
        TESSEL_ASSERT(it != posted.end() && receives[next_wait] == &a, "pipeline: receive {} was not posted", a.str());
        std::vector<Tensor> t = finish_receive(std::move(it->second));
        posted.erase(it);
        ++next_wait;
        post_ahead();
        if (a.kind == ActionKind::RECV_F) {
          for (Tensor& x : t) x.set_requires_grad(true);
          f.inputs = std::move(t);
        } else {
          f.grad_out = std::move(t);
        }
        break;
      }
    }
    timings_.push_back({a.str(), a.kind, start, seconds()});
    // Done with this (micro-batch, chunk): drop what it held.
    if (f.b_done && f.grad_in.empty() && (f.w_done || !schedule_.split_backward)) live.erase({a.microbatch, a.chunk});
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
      const std::vector<Tensor> inputs =
          vs > 0 ? finish_receive(post_receive(schedule_.rank_of(vs - 1), 2, m, vs - 1)) : std::vector<Tensor>{};
      std::vector<Tensor> out = forward(c, m, inputs);
      if (vs == V - 1) {
        loss_sum += local_piece(out.at(0)).item();
      } else {
        for (size_t i = 0; i < out.size(); ++i) out[i] = as_payload(out[i], i);
        post(out, schedule_.rank_of(vs + 1), 2, m, vs, pending_sends);
      }
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
