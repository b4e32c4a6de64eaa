// The distributed dispatcher and its autograd node.
#include "tessel/dist/dispatch.h"

#include <atomic>
#include <map>
#include <mutex>

#include "tessel/autograd/function.h"
#include "tessel/core/context.h"
#include "tessel/core/error.h"
#include "tessel/core/grad_node.h"
#include "tessel/dist/custom_ops.h"
#include "tessel/dist/dtensor.h"
#include "tessel/dist/mesh_comm.h"
#include "tessel/ops/dispatch.h"

namespace tessel {

namespace {

std::map<std::string, DistImpl, std::less<>>& impls() {
  static auto* m = new std::map<std::string, DistImpl, std::less<>>();
  return *m;
}

Placements dual(const Placements& p) {
  Placements out = p;
  for (Placement& x : out)
    if (x.is_partial()) x = Replicate();
  return out;
}

// A recorded distributed call: local saved tensors, the layouts around the local kernel.
class DistOpNode final : public GradNode {
 public:
  DistOpNode(const OpDef& op, Attrs local_attrs, ProcessMesh mesh) : op_(op), attrs_(std::move(local_attrs)), mesh_(std::move(mesh)) {}

  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override {
    const size_t n_in = in_placements_.size();
    std::vector<Tensor> local_grads(outputs_.size());
    for (size_t j = 0; j < grad_outputs.size() && j < out_placements_.size(); ++j) {
      if (!grad_outputs[j].defined()) continue;
      Tensor g = grad_outputs[j];
      Placements want = dual(out_placements_[j]);
      if (!is_dist(g)) g = shard_tensor(g, mesh_, want);
      else if (!(dist_attr(g).mesh == mesh_) || dist_attr(g).placements != want) g = reshard(g, mesh_, want);
      local_grads[j] = local_piece(g);
    }
    std::vector<Tensor> grads(n_in);
    std::vector<Tensor> local_in_grads(n_in);
    if (in_mesh_) {
      bool any = false;
      for (const Tensor& g : local_grads) any = any || g.defined();
      if (any) {
        std::vector<bool> needs(n_in);
        for (size_t i = 0; i < n_in; ++i) needs[i] = wants_grad(i);
        GradCall call{op_, attrs_, inputs_, outputs_, local_metas_, local_grads, needs};
        local_in_grads = run_backward(call);
        local_in_grads.resize(n_in);
      }
    }
    for (size_t i = 0; i < n_in; ++i) {
      if (!wants_grad(i)) continue;
      Tensor lg = local_in_grads[i];
      if (!lg.defined()) {
        if (in_mesh_) continue;
        lg = Tensor::zeros(Shape(global_shapes_[i].size(), 0), input_metas[i].dtype);  // outside the mesh: empty pieces
      }
      grads[i] = wrap_dtensor(lg, DistAttr(mesh_, grad_placements_[i]), global_shapes_[i]);
    }
    return grads;
  }
  std::string name() const override { return std::string(op_.name) + " (distributed)"; }
  bool supports_grad_mask() const override { return true; }
  void release_saved() override {
    inputs_.assign(inputs_.size(), Tensor());
    outputs_.assign(outputs_.size(), Tensor());
  }

  std::vector<Tensor> inputs_, outputs_;  // local, saved per the op's SaveSpec
  std::vector<TensorMeta> local_metas_;
  std::vector<Shape> global_shapes_;
  std::vector<Placements> in_placements_, out_placements_, grad_placements_;
  bool in_mesh_ = true;

 private:
  const OpDef& op_;
  Attrs attrs_;
  ProcessMesh mesh_;
};

std::string describe_inputs(const std::vector<Tensor>& inputs) {
  std::string out;
  for (const Tensor& t : inputs) {
    if (!out.empty()) out += ", ";
    out += is_dist(t) ? fmt::format("{} {}", t.meta().str(), dist_attr(t).str()) : fmt::format("{} (plain)", t.meta().str());
  }
  return out;
}

}  // namespace

void register_dist_impl(std::string_view op, DistImpl impl) { impls()[std::string(op)] = impl; }

std::vector<Tensor> dist_call(const OpDef& op, std::vector<Tensor>& inputs, const Attrs& attrs) {
  // One mesh for every distributed input; plain inputs are replicated on it.
  const DistAttr* first = nullptr;
  for (const Tensor& t : inputs)
    if (is_dist(t)) {
      if (first == nullptr) first = &dist_attr(t);
      else TESSEL_CHECK(dist_attr(t).mesh == first->mesh, "{}: inputs live on different meshes ({}); reshard them onto one",
                        op.name, describe_inputs(inputs));
    }
  TESSEL_ASSERT(first != nullptr, "{}: dist_call without a distributed input", op.name);
  const ProcessMesh mesh = first->mesh;
  TESSEL_CHECK(op.spmd != nullptr, "{}: has no SPMD rule, so it cannot run on distributed inputs ({})", op.name,
               describe_inputs(inputs));
  const Placements all_r(static_cast<size_t>(mesh.ndim()), Replicate());
  for (Tensor& t : inputs)
    if (t.defined() && !is_dist(t)) t = wrap_dtensor(t, DistAttr(mesh, all_r), t.shape());

  std::vector<TensorMeta> metas;
  std::vector<DistAttr> in_attrs;
  for (const Tensor& t : inputs) {
    metas.push_back(t.meta());
    in_attrs.push_back(dist_attr(t));
  }
  const int64_t rank = current_world_rank();
  SpmdCall call{op.name, metas, in_attrs, attrs, rank};
  for (size_t i = 0; i < inputs.size() && i < 64; ++i)
    if (inputs[i].defined() && inputs[i].is_leaf() && inputs[i].requires_grad()) call.params |= uint64_t{1} << i;
  SpmdDecision dec = op.spmd(call);
  if (SpmdAudit* audit = spmd_audit(); audit != nullptr) {
    std::vector<TensorMeta> outs = infer_op(op, metas, attrs);
    outs.resize(outs.size() - static_cast<size_t>(op.num_hidden));
    std::vector<Placements> current;
    for (const DistAttr& a : in_attrs) current.push_back(a.placements);
    audit->decisions.push_back({std::string(op.name), metas, outs, current, dec});
  }
  if (dec.decompose != nullptr) return dec.decompose(inputs, attrs);
  if (dec.custom) {
    auto it = impls().find(op.name);
    TESSEL_ASSERT(it != impls().end(), "{}: the SPMD rule asks for a custom implementation but none is registered", op.name);
    return it->second(op, inputs, attrs, dec);
  }
  TESSEL_ASSERT(dec.inputs.size() == inputs.size(), "{}: the rule placed {} inputs of {}", op.name, dec.inputs.size(),
                inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i)
    if (in_attrs[i].placements != dec.inputs[i]) inputs[i] = reshard_for_op(inputs[i], dec.inputs[i]);

  std::vector<TensorMeta> out_metas = infer_op(op, metas, attrs);
  const size_t visible = out_metas.size() - static_cast<size_t>(op.num_hidden);
  TESSEL_ASSERT(dec.outputs.size() == visible, "{}: the rule placed {} outputs of {}", op.name, dec.outputs.size(), visible);
  const Attrs& local_attrs = dec.local_attrs ? *dec.local_attrs : attrs;
  const bool in_mesh = mesh.contains(rank);

  std::vector<Tensor> locals;
  for (const Tensor& t : inputs) locals.push_back(local_piece(t));
  std::vector<Tensor> local_outs;
  if (in_mesh) {
    GradModeGuard no_grad(false);
    local_outs = run_kernel(op, locals, local_attrs);
  } else {
    for (const TensorMeta& m : out_metas) local_outs.push_back(Tensor::zeros(Shape(m.shape.size(), 0), m.dtype));
  }
  std::vector<Tensor> outs;
  for (size_t j = 0; j < visible; ++j) {
    outs.push_back(wrap_dtensor(std::move(local_outs[j]), DistAttr(mesh, dec.outputs[j]), out_metas[j].shape));
    local_outs[j] = local_piece(outs[j]);
  }

  bool record = op.backward != nullptr && grad_enabled();
  if (record) {
    record = false;
    for (const Tensor& t : inputs) record = record || t.requires_grad();
  }
  if (record) {
    auto node = std::make_shared<DistOpNode>(op, local_attrs, mesh);
    node->seq_nr = next_sequence_nr();
    node->in_mesh_ = in_mesh;
    node->inputs_.resize(inputs.size());
    node->outputs_.resize(local_outs.size());
    // Mesh dims where the local computation is split: each rank computes a different part.
    std::vector<bool> split(static_cast<size_t>(mesh.ndim()), false);
    for (const std::vector<Placements>* ps : {&dec.inputs, &dec.outputs})
      for (const Placements& p : *ps)
        for (size_t m = 0; m < p.size(); ++m) split[m] = split[m] || !p[m].is_replicate();
    for (size_t i = 0; i < inputs.size(); ++i) {
      node->next_edges.push_back(is_floating(inputs[i].dtype()) ? gradient_edge(inputs[i]) : GradEdge{});
      node->input_metas.push_back(inputs[i].meta());
      node->local_metas_.push_back(locals[i].meta());
      node->global_shapes_.push_back(inputs[i].shape());
      if (i < 32 && (op.save.inputs >> i) & 1u) node->inputs_[i] = locals[i].detach();
      Placements g = dec.inputs[i];
      for (size_t m = 0; m < g.size(); ++m) {
        if (g[m].is_partial()) g[m] = Replicate();
        else if (g[m].is_replicate() && split[m]) g[m] = Partial(ReduceOp::sum);
      }
      node->grad_placements_.push_back(g);
    }
    node->in_placements_ = dec.inputs;
    node->out_placements_ = dec.outputs;
    for (size_t j = 0; j < local_outs.size(); ++j) {
      node->output_metas.push_back(j < visible ? out_metas[j] : local_outs[j].meta());
      if (j < 32 && (op.save.outputs >> j) & 1u) node->outputs_[j] = local_outs[j].detach();
    }
    std::vector<Tensor> differentiable;
    for (const Tensor& o : outs) differentiable.push_back(is_floating(o.dtype()) ? o : Tensor());
    set_history(differentiable, node);
  }
  return outs;
}

void install_dist_dispatch() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_custom_ops();
    set_dist_dispatch(&dist_call);
  });
}

}  // namespace tessel
