// Op dispatch and the OpNode that records a call on the autograd tape.
#include "tessel/ops/dispatch.h"

#include <algorithm>

#include <atomic>
#include <map>
#include <mutex>
#include <optional>

#include "tessel/core/context.h"
#include "tessel/core/grad_node.h"
#include "tessel/core/profile.h"
#include "tessel/core/view.h"
#include "tessel/ops/registry.h"
#include "tessel/ops/trace.h"

namespace tessel {

namespace {

std::atomic<DistDispatchFn> g_dist_dispatch{nullptr};

// "<op>.backward", interned per op for the profiler.
std::string_view backward_name(const OpDef& op) {
  static std::mutex mutex;
  static auto* names = new std::map<const OpDef*, std::string>();  // outlives the at-exit profile report
  std::lock_guard lock(mutex);
  auto it = names->find(&op);
  if (it == names->end()) it = names->emplace(&op, std::string(op.name) + ".backward").first;
  return it->second;
}

// A recorded op: keeps the attrs and the saved tensors its backward needs.
class OpNode final : public GradNode {
 public:
  OpNode(const OpDef& op, const Attrs& attrs) : op_(op), attrs_(attrs), backward_name_(backward_name(op)) {}

  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override {
    ProfileScope profile_scope(backward_name_);
    grad_outputs.resize(outputs_.size());
    std::vector<bool> needs(next_edges.size());
    for (size_t i = 0; i < next_edges.size(); ++i) needs[i] = wants_grad(i);
    GradCall call{op_, attrs_, inputs_, outputs_, input_metas, grad_outputs, needs};
    std::vector<Tensor> grads = run_backward(call);
    TESSEL_ASSERT(grads.size() == next_edges.size(), "{} backward returned {} gradients for {} inputs", op_.name,
                  grads.size(), next_edges.size());
    return grads;
  }
  std::string name() const override { return std::string(op_.name); }
  bool supports_grad_mask() const override { return true; }
  void release_saved() override {
    inputs_.assign(inputs_.size(), Tensor());
    outputs_.assign(outputs_.size(), Tensor());
  }

  std::vector<Tensor> inputs_;   // saved (detached) or undefined
  std::vector<Tensor> outputs_;  // saved (detached) or undefined; visible then hidden

 private:
  const OpDef& op_;
  Attrs attrs_;
  std::string_view backward_name_;
};

bool any_dist(const std::vector<Tensor>& inputs) {
  for (const Tensor& t : inputs)
    if (t.defined() && t.impl_ptr()->dist != nullptr) return true;
  return false;
}

std::vector<TensorMeta> metas_of(std::span<const Tensor> inputs) {
  std::vector<TensorMeta> m;
  m.reserve(inputs.size());
  for (const Tensor& t : inputs) m.push_back(t.meta());
  return m;
}

// The one device of an op's defined inputs; throws naming the op, the tensors and their devices
// when they are on two.
Device common_device(const OpDef& op, std::span<const Tensor> inputs) {
  const Tensor* first = nullptr;
  for (const Tensor& t : inputs) {
    if (!t.defined()) continue;
    if (first == nullptr) {
      first = &t;
    } else if (t.device() != first->device()) {
      std::string list;
      for (size_t i = 0; i < inputs.size(); ++i)
        if (inputs[i].defined())
          list += fmt::format("{}input {} {} on {}", list.empty() ? "" : ", ", i, inputs[i].str(),
                              inputs[i].device().str());
      TESSEL_THROW("{}: inputs on two devices ({}); move them to one with Tensor::to", op.name, list);
    }
  }
  return first != nullptr ? first->device() : current_device();
}

// The kernels `op` runs on `device`, and whether they are the CPU's run inside a kernel scope.
struct Kernels {
  ForwardFn forward = nullptr;
  BackwardFn backward = nullptr;
  bool scoped = false;
};
Kernels kernels_for(const OpDef& op, Device device) {
  if (device.is_cpu()) return {op.forward, op.backward, false};
  if (const DeviceKernel* k = find_kernel(op, device.type))
    return {k->forward, k->backward != nullptr ? k->backward : k->composite_backward ? op.backward : nullptr, false};
  if (device_backend(device).runs_cpu_kernels()) return {op.forward, op.backward, true};
  TESSEL_THROW("{}: no kernel for device {} (this op has kernels for: {})", op.name, device.str(), kernel_types(op));
}

void check_arity(const OpDef& op, size_t n) {
  TESSEL_CHECK(op.num_inputs < 0 || static_cast<size_t>(op.num_inputs) == n, "{}: expected {} inputs, got {}", op.name,
               op.num_inputs, n);
}

const OpDef& cast_op() { return *find_op("cast"); }

// Ops whose forwards only make views or move bytes through core/view.h, which handles tensors
// without data: in meta mode they run as they are, so their outputs view their inputs' storage
// where the real ones do (and are charged no memory then).
bool structural(const OpDef& op) {
  for (std::string_view n : {"reshape", "permute", "expand", "contiguous", "cat", "split", "slice"})
    if (op.name == n) return true;
  return false;
}

}  // namespace

std::vector<TensorMeta> infer_op(const OpDef& op, std::span<const TensorMeta> metas, const Attrs& attrs) {
  check_arity(op, metas.size());
  std::vector<TensorMeta> out = op.infer(MetaCall{op, metas, attrs});
  // Outputs live where the inputs do (ops with no inputs make theirs on the current device).
  Device device = metas.empty() ? current_device() : metas[0].device;
  for (const TensorMeta& m : metas)
    TESSEL_CHECK(m.device == device, "{}: inputs on two devices ({} and {})", op.name, device.str(), m.device.str());
  for (TensorMeta& m : out) m.device = device;
  return out;
}

Cost op_cost(const OpDef& op, std::span<const TensorMeta> metas, const Attrs& attrs) {
  std::vector<TensorMeta> out = infer_op(op, metas, attrs);
  return op.cost ? op.cost(MetaCall{op, metas, attrs}, out) : Cost{};
}

std::vector<Tensor> run_kernel(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs) {
  for (size_t i = 0; i < inputs.size(); ++i)
    TESSEL_CHECK(inputs[i].defined(), "{}: input {} is an undefined tensor", op.name, i);
  ProfileScope profile_scope(op.name);
  const Device device = common_device(op, inputs);
  std::vector<TensorMeta> metas = metas_of(inputs);
  std::vector<TensorMeta> out_metas = infer_op(op, metas, attrs);
  if (tracing_ops())
    trace_cost(op.name, op.cost ? op.cost(MetaCall{op, metas, attrs}, out_metas) : Cost{}, false,
               product_sizes(op, metas, attrs));
  DeviceScope device_scope(device);  // what the kernel makes without naming a device lands here
  if (meta_mode()) {
    if (structural(op)) return op.forward(OpCall{op, inputs, attrs, out_metas});
    std::vector<Tensor> outs;
    for (const TensorMeta& m : out_metas) outs.push_back(Tensor::empty(m));
    return outs;
  }
  const Kernels k = kernels_for(op, device);
  std::vector<Tensor> outs;
  if (k.scoped) {
    KernelScope kernel_scope(device);
    outs = k.forward(OpCall{op, inputs, attrs, out_metas});
  } else {
    outs = k.forward(OpCall{op, inputs, attrs, out_metas});
  }
  TESSEL_ASSERT(outs.size() == out_metas.size(), "{} forward made {} outputs, infer said {}", op.name, outs.size(),
                out_metas.size());
  for (const Tensor& o : outs) {
    TESSEL_ASSERT(o.defined(), "{} forward returned an undefined output", op.name);
    TESSEL_ASSERT(o.device() == device, "{}'s kernel for {} made an output on {}", op.name, device.str(),
                  o.device().str());
    for (const Tensor& in : inputs)
      TESSEL_ASSERT(!o.is_same(in), "{} forward returned its input's handle; return a view or detach()", op.name);
  }
  return outs;
}

std::vector<Tensor> run_backward(const GradCall& call) {
  if (tracing_ops()) {
    std::vector<TensorMeta> outs = infer_op(call.op, call.input_metas, call.attrs);
    trace_cost(call.op.name, backward_cost(call.op, call.input_metas, outs, call.attrs, call.needs_grad), true,
               product_sizes(call.op, call.input_metas, call.attrs));
  }
  const Device device = call.input_metas.empty() ? current_device() : call.input_metas[0].device;
  if (!meta_mode()) {
    RankContext& ctx = rank_context();
    ++ctx.op_backward_depth;  // what the backward calls is its own work
    struct Leave {
      RankContext& ctx;
      ~Leave() { --ctx.op_backward_depth; }
    } leave{ctx};
    DeviceScope device_scope(device);
    const Kernels k = kernels_for(call.op, device);
    TESSEL_CHECK(k.backward != nullptr, "{}: no backward kernel for device {} (the forward has one)", call.op.name,
                 device.str());
    if (!k.scoped) return k.backward(call);
    KernelScope kernel_scope(device);
    return k.backward(call);
  }
  std::vector<Tensor> grads(call.input_metas.size());
  for (size_t i = 0; i < grads.size(); ++i)
    if (call.needs_grad[i] && is_floating(call.input_metas[i].dtype)) grads[i] = Tensor::empty(call.input_metas[i]);
  return grads;
}

namespace {

// Under bf16 mixed precision: `inputs` cast to the dtype `op` computes in (its AutocastPolicy).
// The casts are recorded, so gradients flow back to each input in its own dtype (an f32 master
// weight gets an f32 gradient).
void autocast_inputs(const OpDef& op, std::vector<Tensor>& inputs) {
  bool has_bf16 = false, has_f32 = false;
  for (const Tensor& t : inputs) {
    if (!t.defined()) continue;
    has_bf16 = has_bf16 || t.dtype() == DType::bf16;
    has_f32 = has_f32 || t.dtype() == DType::f32;
  }
  DType from = DType::bf16, to = DType::f32;
  switch (op.autocast) {
    case AutocastPolicy::lower:
      if (!has_f32) return;
      from = DType::f32;
      to = DType::bf16;
      break;
    case AutocastPolicy::f32:
      if (!has_bf16) return;
      break;
    case AutocastPolicy::promote:
      if (!has_bf16 || !has_f32) return;
      break;
  }
  for (Tensor& t : inputs)
    if (t.defined() && t.dtype() == from) t = call_op1(cast_op(), {t}, Attrs{{"dtype", to}});
}

}  // namespace

bool& attr_declaration_check() {
  thread_local bool on = false;
  return on;
}

std::vector<Tensor> call_op(const OpDef& op, std::vector<Tensor> inputs, const Attrs& attrs) {
  if (attr_declaration_check()) {
    const std::vector<AttrSpec>& specs = op_attr_specs(op);
    for (const auto& item : attrs.items()) {
      const std::string& key = item.first;  // a named reference: clang 14 cannot capture a structured binding
      TESSEL_CHECK_AS(InternalError,
                      std::any_of(specs.begin(), specs.end(), [&](const AttrSpec& a) { return a.name == key; }),
                      "op '{}' was called with attribute '{}', which its OpDef::attrs does not declare ('{}')",
                      op.name, key, op.attrs);
    }
  }
  // Mixed precision decides the dtypes here, once: what this op's kernel, its distributed
  // dispatch and the ops they call run on is then left as it is.
  std::optional<AutocastScope> autocast_off;
  if (autocast_enabled()) {
    if (&op != &cast_op()) autocast_inputs(op, inputs);
    autocast_off.emplace(false);
  }
  // bf16 computes in f32: cast in (recorded, so gradients flow back as bf16), cast out.
  // Only when every floating input is bf16: a bf16/f32 mix is left for infer to reject.
  bool has_bf16 = false, other_float = false;
  if (op.bf16_via_f32 && op.name != "cast") {
    for (const Tensor& t : inputs) {
      if (!t.defined() || !is_floating(t.dtype())) continue;
      (t.dtype() == DType::bf16 ? has_bf16 : other_float) = true;
    }
    if (has_bf16 && !other_float) {
      for (Tensor& t : inputs)
        if (t.defined() && t.dtype() == DType::bf16) t = call_op1(cast_op(), {t}, Attrs{{"dtype", DType::f32}});
    } else {
      has_bf16 = false;
    }
  }
  if (any_dist(inputs)) {
    DistDispatchFn fn = g_dist_dispatch.load();
    TESSEL_CHECK(fn != nullptr, "{}: distributed input but no distributed dispatch is installed", op.name);
    std::vector<Tensor> outs = fn(op, inputs, attrs);
    if (has_bf16)
      for (Tensor& t : outs)
        if (t.dtype() == DType::f32) t = call_op1(cast_op(), {t}, Attrs{{"dtype", DType::bf16}});
    return outs;
  }
  std::vector<Tensor> outs = run_kernel(op, inputs, attrs);
  size_t visible = outs.size() - static_cast<size_t>(op.num_hidden);

  bool record = false;
  if (op.backward != nullptr && grad_enabled())
    for (const Tensor& t : inputs) record = record || (t.defined() && t.requires_grad());
  if (record) {
    auto node = std::make_shared<OpNode>(op, attrs);
    node->seq_nr = next_sequence_nr();
    node->next_edges.reserve(inputs.size());
    node->inputs_.resize(inputs.size());
    node->outputs_.resize(outs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      node->next_edges.push_back(is_floating(inputs[i].dtype()) ? gradient_edge(inputs[i]) : GradEdge{});
      node->input_metas.push_back(inputs[i].meta());
      if (i < 32 && (op.save.inputs >> i) & 1u) node->inputs_[i] = inputs[i].detach();
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      node->output_metas.push_back(outs[i].meta());
      if (i < 32 && (op.save.outputs >> i) & 1u) node->outputs_[i] = outs[i].detach();
    }
    std::vector<Tensor> differentiable;
    for (size_t i = 0; i < visible; ++i)
      differentiable.push_back(is_floating(outs[i].dtype()) ? outs[i] : Tensor());
    set_history(differentiable, node);
  }
  outs.resize(visible);
  if (has_bf16)
    for (Tensor& t : outs)
      if (t.dtype() == DType::f32) t = call_op1(cast_op(), {t}, Attrs{{"dtype", DType::bf16}});
  return outs;
}

Tensor call_op1(const OpDef& op, std::vector<Tensor> inputs, const Attrs& attrs) {
  std::vector<Tensor> outs = call_op(op, std::move(inputs), attrs);
  TESSEL_ASSERT(outs.size() == 1, "{} has {} outputs, expected one", op.name, outs.size());
  return std::move(outs[0]);
}

void set_dist_dispatch(DistDispatchFn fn) { g_dist_dispatch.store(fn); }

}  // namespace tessel
