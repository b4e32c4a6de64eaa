// Optimizer state, updates dispatched to the parameters' device, clipping and schedules.
#include "tessel/optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "tessel/core/context.h"
#include "tessel/core/profile.h"
#include "tessel/core/thread_pool.h"
#include "tessel/core/view.h"
#include "tessel/dist/dtensor.h"
#include "tessel/dist/mesh_comm.h"
#include "tessel/ops/device_fns.h"
#include "tessel/ops/inplace.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/optim/cpu/updates.h"
#include "tessel/ops/trace.h"

namespace tessel::optim {

namespace {

// An update's operand: contiguous f32, of p's shape and on p's device.
void check_operand(const char* what, const Tensor& p, const Tensor& t) {
  TESSEL_CHECK(t.dtype() == DType::f32 && t.is_contiguous() && t.shape() == p.shape() && t.device() == p.device(),
               "{}: operand {} on {} must be contiguous f32 like the parameter {} on {}", what, t.str(),
               t.device().str(), p.str(), p.device().str());
}

// What an update reads and writes of parameter `p`: its data (this rank's piece when it is
// distributed) and its gradient laid out like it, f32 and contiguous; undefined `grad` when it
// has none.
struct Operands {
  Tensor data, grad;
};

Operands operands(const Tensor& p) {
  Tensor g = p.grad();
  if (!is_dist(p)) return {p, g.defined() ? view::contiguous(view::to_dtype(g, DType::f32)) : Tensor()};
  if (!g.defined()) return {local_piece(p), Tensor()};
  const DistAttr& want = dist_attr(p);
  if (!is_dist(g) || !(dist_attr(g) == want)) {
    NoGradGuard no_grad;
    g = is_dist(g) ? reshard(g, want.mesh, want.placements) : shard_tensor(g, want.mesh, want.placements);
    p.set_grad(g);  // resharded once: the norm and the update read the same
  }
  return {local_piece(p), view::contiguous(view::to_dtype(local_piece(g), DType::f32))};
}

}  // namespace

void adamw_update(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, int64_t step,
                  const AdamWOptions& o, double lr, bool decay, float grad_scale) {
  for (const Tensor* t : {&g, &m, &v}) check_operand("adamw_update", p, *t);
  if (p.is_meta()) return;
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(step));
  const AdamWScalars k{decay ? static_cast<float>(1.0 - lr * o.weight_decay) : 1.0f,
                       static_cast<float>(1.0 - o.beta1),
                       static_cast<float>(o.beta2),
                       static_cast<float>(1.0 - o.beta2),
                       static_cast<float>(lr / bc1),
                       static_cast<float>(std::sqrt(bc2)),
                       static_cast<float>(o.eps),
                       grad_scale};
  if (auto f = device_fn<AdamWFn>("adamw_update", p.device())) return f(p, g, m, v, k);
  kernels::host_kernel("adamw_update", p.device(), [&] { cpu::adamw_update(p, g, m, v, k); });
}

void sgd_update(const Tensor& p, const Tensor& g, const Tensor* buf, bool first_step, const SgdOptions& o, double lr,
                float grad_scale) {
  check_operand("sgd_update", p, g);
  if (buf != nullptr) check_operand("sgd_update", p, *buf);
  if (p.is_meta()) return;
  kernels::host_kernel("sgd_update", p.device(), [&] { cpu::sgd_update(p, g, buf, first_step, o, lr, grad_scale); });
}

Optimizer::Optimizer(std::vector<ParamRef> params, double lr, std::vector<std::string> slots)
    : params_(std::move(params)), lr_(lr), slot_names_(std::move(slots)) {
  for (const ParamRef& p : params_) {
    TESSEL_CHECK(p.param.defined(), "optimizer: parameter '{}' is undefined", p.name);
    const Tensor& data = is_dist(p.param) ? local_piece(p.param) : p.param;
    TESSEL_CHECK(p.param.dtype() == DType::f32 && data.is_contiguous(),
                 "optimizer: parameter '{}' must be a contiguous f32 tensor (got {})", p.name, p.param.str());
  }
}

void Optimizer::zero_grad() {
  for (ParamRef& p : params_) p.param.set_grad(Tensor());
}

Tensor& Optimizer::slot(size_t i, const std::string& slot) {
  Tensor& t = state_[params_[i].name + "." + slot];
  if (t.defined()) return t;
  const Tensor& p = params_[i].param;
  if (is_dist(p)) {  // laid out like the parameter: each rank keeps the state of its piece
    const DistAttr& a = dist_attr(p);
    t = dtensor_from_local(Tensor::zeros(local_piece(p).shape(), DType::f32), a.mesh, a.placements, p.shape());
  } else {
    t = Tensor::zeros(p.shape(), DType::f32);
  }
  return t;
}

// A state slot's tensor: its piece when distributed.
static Tensor slot_local(const Tensor& t) { return is_dist(t) ? local_piece(t) : t; }

std::map<std::string, Tensor> Optimizer::state_dict() const {
  std::map<std::string, Tensor> out = state_;
  out["step"] = Tensor::scalar(static_cast<double>(step_), DType::i64);
  return out;
}

void Optimizer::load_state_dict(const std::map<std::string, Tensor>& state) {
  auto it = state.find("step");
  TESSEL_CHECK_AS(CheckpointError, it != state.end(), "optimizer state: missing \"step\"");
  const Tensor& st = it->second;
  TESSEL_CHECK_AS(CheckpointError, st.dim() == 0 && (st.dtype() == DType::i64 || st.dtype() == DType::i32),
                  "optimizer state: \"step\" must be an integer scalar, not {}", st.str());
  const double value = st.item();  // exact: any i32, and the i64 step counts a run can reach
  TESSEL_CHECK_AS(CheckpointError, value >= 0 && value < 0x1p53, "optimizer state: \"step\" is {}", value);
  const int64_t step = static_cast<int64_t>(value);
  std::map<std::string, Tensor> loaded;
  for (const ParamRef& p : params_)
    for (const std::string& s : slot_names_) {
      std::string key = p.name + "." + s;
      auto e = state.find(key);
      if (e == state.end()) {
        TESSEL_CHECK_AS(CheckpointError, step == 0, "optimizer state: missing \"{}\" (saved at step {})", key, step);
        continue;
      }
      TESSEL_CHECK_AS(CheckpointError, is_floating(e->second.dtype()),
                      "optimizer state: \"{}\" is {}, not a floating-point tensor", key, e->second.dtype());
      TESSEL_CHECK_AS(CheckpointError, e->second.shape() == p.param.shape(),
                      "optimizer state: \"{}\" has shape {} but the parameter has {}", key, shape_str(e->second.shape()),
                      shape_str(p.param.shape()));
      loaded[key] = view::clone(view::to_dtype(e->second, DType::f32));
    }
  for (const auto& [key, t] : state) {
    (void)t;
    TESSEL_CHECK_AS(CheckpointError, key == "step" || loaded.count(key), "optimizer state: unexpected entry \"{}\"", key);
  }
  state_ = std::move(loaded);
  step_ = step;
}

AdamW::AdamW(std::vector<ParamRef> params, AdamWOptions options)
    : Optimizer(std::move(params), options.lr, {"exp_avg", "exp_avg_sq"}), options_(options) {}

void AdamW::apply(float grad_scale) {
  ProfileScope profile_scope("optimizer.adamw");
  ++step_;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto [data, g] = operands(params_[i].param);
    if (!g.defined()) continue;
    Tensor& m = slot(i, "exp_avg");
    Tensor& v = slot(i, "exp_avg_sq");
    // Decoupled weight decay on matrices (embeddings, projections), not on biases and norms.
    bool decay = params_[i].decay.value_or(params_[i].param.dim() >= 2);
    adamw_update(data, g, slot_local(m), slot_local(v), step_, options_, lr_, decay, grad_scale);
  }
}

Sgd::Sgd(std::vector<ParamRef> params, SgdOptions options)
    : Optimizer(std::move(params), options.lr, options.momentum != 0.0 ? std::vector<std::string>{"momentum_buffer"}
                                                                       : std::vector<std::string>{}),
      options_(options) {
  TESSEL_CHECK(!options.nesterov || (options.momentum > 0 && options.dampening == 0),
               "sgd: nesterov needs momentum > 0 and dampening 0 (got momentum {}, dampening {})", options.momentum,
               options.dampening);
}

void Sgd::apply(float grad_scale) {
  ++step_;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto [data, g] = operands(params_[i].param);
    if (!g.defined()) continue;
    bool first = options_.momentum != 0.0 && !state_.count(params_[i].name + ".momentum_buffer");
    Tensor buf = options_.momentum != 0.0 ? slot_local(slot(i, "momentum_buffer")) : Tensor();
    sgd_update(data, g, buf.defined() ? &buf : nullptr, first, options_, lr_, grad_scale);
  }
}

double sum_squares(const Tensor& x) {
  if (tracing_ops()) trace_cost("sum_squares", Cost{2.0 * static_cast<double>(x.numel()), static_cast<double>(x.nbytes())});
  if (x.is_meta()) return 0;
  TESSEL_CHECK(x.dtype() == DType::f32 && x.is_contiguous(), "sum_squares: expected a contiguous f32 tensor, got {}",
               x.str());
  double s = 0;
  kernels::host_kernel("sum_squares", x.device(), [&] { s = cpu::sum_squares(x); });
  return s;
}

double grad_sum_squares(const std::vector<Tensor>& params) {
  ProfileScope profile_scope("optimizer.grad_norm");
  double total = 0, local = 0;  // over distributed parameters, and over the others
  // Distributed parameters: their ranks' sums, each element once, summed over every rank of
  // their meshes (the ranks of each mesh, in one group of all of them).
  std::vector<int64_t> ranks;
  bool any_dist = false;
  for (const Tensor& p : params) {
    const auto [data, g] = operands(p);
    if (!is_dist(p)) {
      if (g.defined()) local += sum_squares(g);
      continue;
    }
    const DistAttr& a = dist_attr(p);
    any_dist = true;
    for (int64_t r : a.mesh.process_ids()) ranks.push_back(r);
    if (!g.defined() || !a.mesh.contains(current_world_rank())) continue;
    const std::vector<int64_t> at = a.mesh.coord(current_world_rank());
    bool counts = true;  // a replica counts on mesh coordinate 0 of each dim it is replicated over
    for (size_t d = 0; d < at.size(); ++d) counts = counts && (a.placements[d].is_shard() || at[d] == 0);
    if (counts) total += sum_squares(g);
  }
  if (any_dist) {
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    auto group = mesh_dim_group(ProcessMesh({static_cast<int64_t>(ranks.size())}, ranks, {"all"}), 0);
    group->all_reduce(&total, 1, DType::f64, ReduceOp::sum);
  }
  return total + local;
}

float clip_coefficient(double norm, double max_norm) {
  return max_norm > 0 && norm + 1e-6 > max_norm ? static_cast<float>(max_norm / (norm + 1e-6)) : 1.0f;
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double sum_squares) {
  TESSEL_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be positive, got {}", max_norm);
  double norm = std::sqrt(sum_squares);
  const float coef = clip_coefficient(norm, max_norm);
  if (coef < 1.0f)
    for (const Tensor& p : params)
      if (p.grad().defined()) scale_(is_dist(p.grad()) ? local_piece(p.grad()) : p.grad(), coef);
  return norm;
}

double LrSchedule::at(int64_t step) const {
  if (warmup > 0 && step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (kind == Kind::constant) return lr;
  double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
  double ratio = std::clamp(static_cast<double>(step - warmup) / span, 0.0, 1.0);
  if (kind == Kind::linear) return lr - ratio * (lr - min_lr);
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (lr - min_lr);
}

LrSchedule::Kind LrSchedule::parse_kind(std::string_view text) {
  if (text == "constant") return Kind::constant;
  if (text == "cosine") return Kind::cosine;
  if (text == "linear") return Kind::linear;
  TESSEL_THROW("unknown lr schedule '{}' (expected constant, cosine or linear)", text);
}

}  // namespace tessel::optim
