// Optimizers (SGD with momentum/Nesterov, AdamW with decoupled weight decay on matrices only),
// gradient clipping with torch.nn.utils.clip_grad_norm_ semantics, and learning-rate
// schedules. The update rules are also exposed as kernels over flat spans so a sharded
// optimizer can run them on its shard alone. Optimizer state is a dict of named tensors
// ("<parameter>.exp_avg", ...) that checkpoints save and load.
//
// Parameters may be distributed tensors (on any mesh, as a program written with shard_tensor
// makes them): each rank then updates its piece, the state tensors are distributed with the
// parameter's placements, a gradient arriving in another layout (a Partial sum, say) is first
// resharded to the parameter's, and the gradient norm counts every element once across ranks
// (all of a mesh's ranks must call step() and clipping together, as they run the backward).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/tensor.h"

namespace tessel::optim {

struct ParamRef {
  std::string name;
  Tensor param;  // a leaf; its .grad() is read by step()
  // Whether weight decay applies; unset: to matrices (dim >= 2) — not to biases and norms.
  std::optional<bool> decay = std::nullopt;
};

struct AdamWOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};

struct SgdOptions {
  double lr = 1e-2, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
};

// One AdamW step in place on contiguous f32 tensors of one shape and device (PyTorch's
// single-tensor AdamW, in f32), run on their device:
// p *= 1 - lr·wd (if decay);  m += (1-β1)(g - m);  v = β2 v + (1-β2) g²;
// p -= lr/(1-β1^t) · m / (sqrt(v)/sqrt(1-β2^t) + eps).
// The gradient read is g · grad_scale (a clipping coefficient applied on the fly). A tensor
// made in meta mode is left alone.
void adamw_update(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, int64_t step,
                  const AdamWOptions& o, double lr, bool decay, float grad_scale = 1.0f);
// One SGD step (PyTorch semantics; the first step seeds the momentum buffer `buf`, null
// without momentum, with the gradient).
void sgd_update(const Tensor& p, const Tensor& g, const Tensor* buf, bool first_step, const SgdOptions& o, double lr,
                float grad_scale = 1.0f);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Applies one update from each parameter's .grad() · grad_scale (parameters without a
  // gradient are skipped); a clipping coefficient goes in as grad_scale instead of a pass
  // that rescales every gradient first.
  void step(float grad_scale = 1.0f) { apply(grad_scale); }
  // Drops every parameter's gradient.
  void zero_grad();
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  int64_t steps() const { return step_; }
  const std::vector<ParamRef>& params() const { return params_; }

  // Named state tensors plus "step"; loading checks every name, shape and dtype.
  std::map<std::string, Tensor> state_dict() const;
  void load_state_dict(const std::map<std::string, Tensor>& state);

 protected:
  Optimizer(std::vector<ParamRef> params, double lr, std::vector<std::string> slots);
  virtual void apply(float grad_scale) = 0;
  // The state slot `slot` of parameter i (zeros of the parameter's shape, f32, made on first use).
  Tensor& slot(size_t i, const std::string& slot);

  std::vector<ParamRef> params_;
  double lr_;
  int64_t step_ = 0;
  std::vector<std::string> slot_names_;
  std::map<std::string, Tensor> state_;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<ParamRef> params, AdamWOptions options);
  const AdamWOptions& options() const { return options_; }

 private:
  void apply(float grad_scale) override;
  AdamWOptions options_;
};

class Sgd : public Optimizer {
 public:
  Sgd(std::vector<ParamRef> params, SgdOptions options);

 private:
  void apply(float grad_scale) override;
  SgdOptions options_;
};

// Σ x[i]² over a contiguous f32 tensor, in f64 with a fixed order (8 partial sums), on its
// device: the building block of the gradient norm. A tensor made in meta mode (tracing) adds
// its cost to the rank's op trace and counts 0.
double sum_squares(const Tensor& x);

// Σ over parameters of Σ grad² (in f64) — the square of the global gradient norm. Parameters
// without a gradient count zero. For distributed parameters every element counts once: each
// gradient is resharded to its parameter's layout, replicas count on their mesh coordinate 0
// only, and the sum is all-reduced over the ranks of the parameters' meshes.
double grad_sum_squares(const std::vector<Tensor>& params);
// The factor torch.nn.utils.clip_grad_norm_ scales gradients by: max_norm / (norm + 1e-6)
// when that is below 1, else 1 (also 1 for max_norm 0, no clipping); as f32, the precision
// the updates apply it in.
float clip_coefficient(double norm, double max_norm);
// Scales every gradient by clip_coefficient(norm, max_norm), where norm is sqrt(sum_squares);
// returns norm (torch.nn.utils.clip_grad_norm_).
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double sum_squares);
inline double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  return clip_grad_norm(params, max_norm, grad_sum_squares(params));
}

// Learning rate by step: constant, or linear warmup over `warmup` steps (lr·(s+1)/warmup)
// then cosine or linear decay from lr to min_lr at step `total`.
struct LrSchedule {
  enum class Kind { constant, cosine, linear };
  Kind kind = Kind::constant;
  double lr = 1e-3, min_lr = 0.0;
  int64_t warmup = 0, total = 1;
  double at(int64_t step) const;
  // "constant", "cosine", "linear"; throws naming the text.
  static Kind parse_kind(std::string_view text);
};

}  // namespace tessel::optim
