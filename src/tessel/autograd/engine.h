// The backward engine: runs the recorded nodes reachable from the roots in reverse tape
// order (descending sequence number), summing gradients that meet, and accumulating into
// the leaves' .grad. Backward ops run with gradient recording off.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "tessel/core/grad_node.h"
#include "tessel/core/tensor.h"

namespace tessel {

// Whether a backward pass is running on this rank (a forward run now is a recompute).
bool in_backward();

// Backpropagates from `root`. `grad` defaults to 1 for a one-element root and must be given
// (with the root's shape) otherwise. Without retain_graph the saved tensors of every node
// used are freed, and a second backward through them throws.
void backward(const Tensor& root, const Tensor& grad = {}, bool retain_graph = false);
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph = false);

// Gradients of `outputs` with respect to `inputs` (leaves or intermediate tensors), returned
// instead of accumulated: no .grad is touched. Undefined where an input gets no gradient.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false);

// A backward split in two, as zero-bubble pipeline schedules need: backward_inputs computes the
// gradients that flow towards the given inputs (B) and leaves the parameter (leaf) gradients of
// every op that can compute them separately for backward_weights (W), which accumulates them
// into the leaves' .grad. Ops that cannot split give all their gradients in B.
struct DeferredWeightGrads {
  struct Item {
    std::shared_ptr<GradNode> node;
    std::vector<Tensor> grad_outputs;
    std::vector<char> mask;  // the leaf edges left for W
  };
  std::vector<Item> items;
  bool retain_graph = false;
  // Leaves with grad_ready_hooks and how many of their gradients W still owes.
  std::vector<std::pair<std::shared_ptr<AutogradMeta>, int>> pending_ready;
};
// Like backward(roots, grads), except that leaves other than `inputs` get their gradients only
// from backward_weights. `inputs` (leaves) get theirs now, in .grad as usual.
DeferredWeightGrads backward_inputs(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                                    const std::vector<Tensor>& inputs, bool retain_graph = false);
void backward_weights(DeferredWeightGrads&& deferred);

// Activation recompute: y = fn(x) computed without keeping its intermediate activations; the
// backward runs fn again with recording on and backpropagates through it (parameters used by
// fn receive their gradients then). fn must be deterministic (dropout is: its mask is a
// function of the seed, step and position, restored by `restore` before the rerun when given).
Tensor recompute(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x,
                 const std::function<void()>& restore = {});

}  // namespace tessel
