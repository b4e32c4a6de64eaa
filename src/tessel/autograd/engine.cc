// Backward engine and custom functions.
#include "tessel/autograd/engine.h"

#include <algorithm>
#include <queue>
#include <unordered_map>

#include "tessel/autograd/function.h"
#include "tessel/core/context.h"
#include "tessel/core/grad_node.h"
#include "tessel/core/profile.h"
#include "tessel/core/view.h"
#include "tessel/ops/elementwise.h"
#include "tessel/ops/inplace.h"
#include "tessel/sharding/spmd.h"

namespace tessel {

namespace {

// Marks the ops it covers as gradient sums (an op trace counts them as backward work).
struct GradSumScope {
  RankContext& ctx = rank_context();
  bool previous = ctx.summing_grads;
  GradSumScope() { ctx.summing_grads = true; }
  ~GradSumScope() { ctx.summing_grads = previous; }
  GradSumScope(const GradSumScope&) = delete;
  GradSumScope& operator=(const GradSumScope&) = delete;
};

// Adds `g` into a gradient slot; takes ownership of g's storage when nobody else holds it.
void add_into(Tensor& slot, Tensor&& g) {
  if (!slot.defined()) {
    slot = std::move(g);
    return;
  }
  if (slot.impl_ptr()->dist == nullptr && slot.use_count() == 1 && slot.storage().use_count() == 1 &&
      slot.is_contiguous() && g.impl_ptr()->dist == nullptr) {
    add_(slot, g);
  } else {
    GradSumScope summing;
    slot = add(slot, g);
  }
}

void check_grad_shape(const Tensor& g, const TensorMeta& expected, const std::string& node, size_t input) {
  TESSEL_CHECK(g.shape() == expected.shape,
               "backward: '{}' produced a gradient of shape {} for its input {}, which has shape {}", node,
               shape_str(g.shape()), input, shape_str(expected.shape));
}

// The B half of a split backward: leaves not in `immediate` are deferred.
struct Split {
  std::unordered_map<const AutogradMeta*, bool> immediate;
  DeferredWeightGrads* out = nullptr;
  bool deferred_leaf(const GradEdge& e) const { return e.leaf != nullptr && !immediate.count(e.leaf.get()); }
};

struct Capture {
  std::unordered_map<const AutogradMeta*, size_t> leaves;                  // leaf meta -> result slot
  std::unordered_map<const GradNode*, std::vector<std::pair<int, size_t>>> outputs;  // (output_nr, slot)
  std::vector<Tensor> results;
  bool active = false;
};

bool is_distributed(const Tensor& t) { return t.defined() && t.impl_ptr()->dist != nullptr; }

// Leaves with grad_ready_hooks, and the gradients each still expects from this backward: their
// hooks run when the count reaches zero.
struct ReadyCounts {
  std::unordered_map<AutogradMeta*, std::pair<std::shared_ptr<AutogradMeta>, int>> left;

  void expect(const std::shared_ptr<AutogradMeta>& leaf) {
    if (leaf == nullptr || leaf->grad_ready_hooks.empty()) return;
    auto [it, fresh] = left.try_emplace(leaf.get(), leaf, 0);
    ++it->second.second;
  }
  // One of `leaf`'s expected gradients has been accumulated (or turned out undefined).
  void arrived(AutogradMeta* leaf) {
    auto it = left.find(leaf);
    if (it == left.end() || --it->second.second > 0) return;
    std::shared_ptr<AutogradMeta> meta = std::move(it->second.first);
    left.erase(it);
    if (meta->grad.defined())
      for (const auto& hook : meta->grad_ready_hooks) hook(meta->grad);
  }
};

void accumulate_leaf(const std::shared_ptr<AutogradMeta>& leaf, const TensorMeta& meta, Tensor&& g, Capture& cap) {
  ProfileScope profile_scope("(autograd accumulate)");
  if (g.dtype() != meta.dtype) g = is_distributed(g) ? cast(g, meta.dtype) : view::to_dtype(g, meta.dtype);
  if (is_distributed(g) && !cap.active) {
    // Distributed gradients keep the layout they arrive in (often Partial); adding two layouts
    // goes through the op, which reshards as its rule says. Two pieces of one layout add in
    // place when nobody else sees the held one (a tied embedding's two gradients).
    if (leaf->grad.defined() && is_distributed(leaf->grad)) {
      const DistSpec& have = *leaf->grad.impl_ptr()->dist;
      const DistSpec& more = *g.impl_ptr()->dist;
      if (have.attr == more.attr && leaf->grad.use_count() == 1 && have.local.defined() &&
          have.local.storage().use_count() == 1 && have.local.is_contiguous() &&
          have.local.shape() == more.local.shape() && have.local.dtype() == more.local.dtype()) {
        add_(have.local, more.local);
        for (const auto& hook : leaf->post_accumulate_hooks) hook(leaf->grad);
        return;
      }
    }
    GradSumScope summing;
    leaf->grad = leaf->grad.defined() ? add(leaf->grad, g) : g;
    for (const auto& hook : leaf->post_accumulate_hooks) hook(leaf->grad);
    return;
  }
  if (cap.active) {
    auto it = cap.leaves.find(leaf.get());
    if (it != cap.leaves.end()) add_into(cap.results[it->second], std::move(g));
    return;
  }
  if (!leaf->grad.defined()) {
    // Keep the incoming tensor when nobody else can see it; otherwise copy, so later
    // in-place accumulation never writes into someone else's tensor.
    bool owned = g.use_count() == 1 && g.storage().use_count() == 1 && g.is_contiguous() && g.offset() == 0;
    leaf->grad = owned ? std::move(g) : view::clone(g);
  } else {
    add_(leaf->grad, g);
  }
  for (const auto& hook : leaf->post_accumulate_hooks) hook(leaf->grad);
}

// Counts a backward pass on this rank for its scope, with mixed precision off: a backward's
// dtypes are its forward's (a recompute turns it back on for its rerun).
struct BackwardScope {
  BackwardScope() { ++rank_context().backward_depth; }
  ~BackwardScope() { --rank_context().backward_depth; }
  AutocastScope autocast_off{false};
};

void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& root_grads, bool retain_graph,
                  Capture& cap, const Split* split = nullptr) {
  BackwardScope in_backward;
  TESSEL_CHECK(root_grads.empty() || root_grads.size() == roots.size(),
               "backward: {} roots but {} gradients", roots.size(), root_grads.size());
  GradModeGuard no_grad(false);
  ProfileScope profile_scope("(autograd backward)");

  // Seed gradients.
  ReadyCounts ready_counts;
  std::vector<AutogradMeta*> root_leaves;
  std::unordered_map<GradNode*, std::vector<Tensor>> buffers;
  std::vector<GradNode*> starts;
  for (size_t r = 0; r < roots.size(); ++r) {
    const Tensor& root = roots[r];
    TESSEL_CHECK(root.defined(), "backward: root {} is undefined", r);
    TESSEL_CHECK(root.requires_grad(), "backward: root {} ({}) does not require grad and has no grad_fn", r, root.str());
    Tensor g = root_grads.empty() ? Tensor() : root_grads[r];
    if (!g.defined()) {
      TESSEL_CHECK(root.numel() == 1,
                   "backward: a gradient can be implied only for a one-element root; root {} is {} — pass its gradient",
                   r, root.str());
      g = Tensor::ones(root.shape(), root.dtype(), root.device());
    } else {
      TESSEL_CHECK(g.shape() == root.shape(), "backward: gradient of shape {} given for root {} of shape {}",
                   shape_str(g.shape()), r, shape_str(root.shape()));
      if (g.dtype() != root.dtype()) g = view::to_dtype(g, root.dtype());
    }
    GradEdge e = gradient_edge(root);
    if (e.leaf) {
      if (!cap.active) ready_counts.expect(e.leaf);
      root_leaves.push_back(e.leaf.get());
      accumulate_leaf(e.leaf, root.meta(), std::move(g), cap);
      continue;
    }
    std::vector<Tensor>& buf = buffers[e.node.get()];
    buf.resize(e.node->output_metas.size());
    add_into(buf[static_cast<size_t>(e.output_nr)], std::move(g));
    starts.push_back(e.node.get());
  }

  // Dependency counts over the reachable graph, and the leaf gradients each hooked leaf expects.
  std::unordered_map<GradNode*, int> deps;
  std::unordered_map<GradNode*, std::shared_ptr<GradNode>> owners;  // for deferred nodes
  if (split != nullptr)
    for (const Tensor& root : roots)
      if (GradEdge e = gradient_edge(root); e.node) owners[e.node.get()] = e.node;
  std::vector<GradNode*> stack = starts;
  std::unordered_map<GradNode*, bool> seen;
  for (GradNode* n : starts) seen[n] = true;
  while (!stack.empty()) {
    GradNode* n = stack.back();
    stack.pop_back();
    for (const GradEdge& e : n->next_edges) {
      if (!cap.active) ready_counts.expect(e.leaf);
      if (!e.node) continue;
      ++deps[e.node.get()];
      if (split != nullptr) owners.emplace(e.node.get(), e.node);
      if (!seen[e.node.get()]) {
        seen[e.node.get()] = true;
        stack.push_back(e.node.get());
      }
    }
  }

  for (AutogradMeta* leaf : root_leaves) ready_counts.arrived(leaf);

  auto later = [](GradNode* a, GradNode* b) { return a->seq_nr < b->seq_nr; };
  std::priority_queue<GradNode*, std::vector<GradNode*>, decltype(later)> ready(later);
  // Each start node is queued once, when it has no pending producers.
  std::unordered_map<GradNode*, bool> queued;
  for (GradNode* n : starts)
    if (deps[n] == 0 && !queued[n]) {
      queued[n] = true;
      ready.push(n);
    }

  while (!ready.empty()) {
    GradNode* node = ready.top();
    ready.pop();
    std::vector<Tensor> grads_out = std::move(buffers[node]);
    buffers.erase(node);
    grads_out.resize(node->output_metas.size());

    if (cap.active) {
      auto it = cap.outputs.find(node);
      if (it != cap.outputs.end())
        for (auto [nr, slot] : it->second)
          if (grads_out[static_cast<size_t>(nr)].defined()) add_into(cap.results[slot], Tensor(grads_out[static_cast<size_t>(nr)]));
    }

    bool any = false;
    for (const Tensor& g : grads_out) any = any || g.defined();
    std::vector<Tensor> grads_in;
    std::vector<char> split_later;  // the leaf edges this node leaves to W
    if (any) {
      TESSEL_CHECK(!node->released,
                   "backward: trying to go through '{}' a second time, but its saved tensors were freed by the first "
                   "backward; pass retain_graph=true to the first backward",
                   node->name());
      // A split backward keeps this node's parameter gradients for W: B computes the rest.
      std::vector<char> later;
      if (split != nullptr && node->supports_grad_mask()) {
        for (const GradEdge& e : node->next_edges) later.push_back(split->deferred_leaf(e) ? 1 : 0);
        if (std::find(later.begin(), later.end(), 1) == later.end()) later.clear();
      }
      if (!later.empty()) {
        split_later = later;
        split->out->items.push_back({owners.at(node), grads_out, later});
        node->grad_mask.resize(later.size());
        bool rest = false;
        for (size_t i = 0; i < later.size(); ++i) {
          node->grad_mask[i] = later[i] ? 0 : 1;
          rest = rest || (node->grad_mask[i] != 0 && node->next_edges[i].active());
        }
        if (rest) grads_in = node->apply(std::move(grads_out));
        node->grad_mask.clear();
      } else {
        grads_in = node->apply(std::move(grads_out));
        if (!retain_graph) {
          node->release_saved();
          node->released = true;
        }
      }
    }
    grads_in.resize(node->next_edges.size());
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const GradEdge& e = node->next_edges[i];
      Tensor& g = grads_in[i];
      if (g.defined() && e.active()) check_grad_shape(g, node->input_metas[i], node->name(), i);
      if (e.leaf) {
        if (g.defined()) accumulate_leaf(e.leaf, node->input_metas[i], std::move(g), cap);
        if (!(split_later.size() > i && split_later[i])) ready_counts.arrived(e.leaf.get());
      } else if (e.node) {
        GradNode* next = e.node.get();
        if (g.defined()) {
          std::vector<Tensor>& buf = buffers[next];
          buf.resize(next->output_metas.size());
          add_into(buf[static_cast<size_t>(e.output_nr)], std::move(g));
        }
        if (--deps[next] == 0 && !queued[next]) {
          queued[next] = true;
          ready.push(next);
        }
      }
    }
  }
  // A split backward leaves the rest of these leaves' gradients to W.
  if (split != nullptr)
    for (auto& [raw, entry] : ready_counts.left) split->out->pending_ready.push_back(std::move(entry));
}

// A node whose backward is a lambda (see function.h).
class FunctionNode final : public GradNode {
 public:
  FunctionNode(std::string name, CustomBackward fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override { return fn_(std::move(grad_outputs)); }
  std::string name() const override { return name_; }
  void release_saved() override { fn_ = nullptr; }

 private:
  std::string name_;
  CustomBackward fn_;
};

}  // namespace

bool in_backward() { return rank_context().backward_depth > 0; }

void backward(const Tensor& root, const Tensor& grad, bool retain_graph) {
  backward(std::vector<Tensor>{root}, std::vector<Tensor>{grad}, retain_graph);
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph) {
  Capture none;
  run_backward(roots, grads, retain_graph, none);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph) {
  Capture cap;
  cap.active = true;
  cap.results.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    TESSEL_CHECK(inputs[i].defined() && inputs[i].requires_grad(), "grad: input {} ({}) does not require grad", i,
                 inputs[i].str());
    GradEdge e = gradient_edge(inputs[i]);
    if (e.leaf) cap.leaves[e.leaf.get()] = i;
    else cap.outputs[e.node.get()].emplace_back(e.output_nr, i);
  }
  run_backward(outputs, grad_outputs, retain_graph, cap);
  return cap.results;
}

DeferredWeightGrads backward_inputs(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                                    const std::vector<Tensor>& inputs, bool retain_graph) {
  DeferredWeightGrads out;
  out.retain_graph = retain_graph;
  Split split;
  split.out = &out;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad())
      if (GradEdge e = gradient_edge(t); e.leaf) split.immediate[e.leaf.get()] = true;
  Capture none;
  run_backward(roots, grads, retain_graph, none, &split);
  return out;
}

void backward_weights(DeferredWeightGrads&& deferred) {
  BackwardScope in_backward;
  GradModeGuard no_grad(false);
  ProfileScope profile_scope("(autograd backward weights)");
  Capture none;
  ReadyCounts ready_counts;
  for (auto& [leaf, count] : deferred.pending_ready) ready_counts.left.try_emplace(leaf.get(), std::move(leaf), count);
  deferred.pending_ready.clear();
  for (DeferredWeightGrads::Item& item : deferred.items) {
    GradNode& node = *item.node;
    node.grad_mask = item.mask;
    std::vector<Tensor> grads_in = node.apply(std::move(item.grad_outputs));
    node.grad_mask.clear();
    grads_in.resize(node.next_edges.size());
    for (size_t i = 0; i < node.next_edges.size(); ++i) {
      const GradEdge& e = node.next_edges[i];
      if (!item.mask[i] || !e.leaf) continue;
      if (grads_in[i].defined()) {
        check_grad_shape(grads_in[i], node.input_metas[i], node.name(), i);
        accumulate_leaf(e.leaf, node.input_metas[i], std::move(grads_in[i]), none);
      }
      ready_counts.arrived(e.leaf.get());
    }
    if (!deferred.retain_graph) {
      node.release_saved();
      node.released = true;
    }
    item.node.reset();
  }
  deferred.items.clear();
}

Tensor recompute(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x, const std::function<void()>& restore) {
  if (!grad_enabled() || !x.requires_grad()) return fn(x);
  Tensor y;
  {
    GradModeGuard off(false);
    y = fn(x);
  }
  y = y.detach();
  Tensor saved = x.detach();
  const bool autocast = autocast_enabled();  // the rerun computes in the forward's dtypes
  record_function("recompute", {x}, {y}, [fn, saved, restore, autocast](std::vector<Tensor>&& g) {
    if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
    if (restore) restore();
    Tensor xi = saved.detach();
    xi.set_requires_grad(true);
    Tensor yi;
    {
      GradModeGuard on(true);
      AutocastScope same(autocast);
      yi = fn(xi);
    }
    backward(yi, g[0]);
    return std::vector<Tensor>{xi.grad()};
  });
  return y;
}

bool record_function(std::string name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                     CustomBackward fn) {
  if (!grad_enabled()) return false;
  bool any = false;
  for (const Tensor& t : inputs) any = any || (t.defined() && t.requires_grad());
  if (!any) return false;
  auto node = std::make_shared<FunctionNode>(std::move(name), std::move(fn));
  node->seq_nr = next_sequence_nr();
  for (const Tensor& t : inputs) {
    node->next_edges.push_back(t.defined() && is_floating(t.dtype()) ? gradient_edge(t) : GradEdge{});
    node->input_metas.push_back(t.defined() ? t.meta() : TensorMeta{});
  }
  for (const Tensor& t : outputs) node->output_metas.push_back(t.defined() ? t.meta() : TensorMeta{});
  set_history(outputs, node);
  return true;
}

}  // namespace tessel
