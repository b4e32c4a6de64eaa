// The backward engine: runs the recorded nodes reachable from the roots in reverse tape
// order (descending sequence number), summing gradients that meet, and accumulating into
// the leaves' .grad. Backward ops run with gradient recording off.
#pragma once

#include <vector>

#include "tessel/core/tensor.h"

namespace tessel {

// Backpropagates from `root`. `grad` defaults to 1 for a one-element root and must be given
// (with the root's shape) otherwise. Without retain_graph the saved tensors of every node
// used are freed, and a second backward through them throws.
void backward(const Tensor& root, const Tensor& grad = {}, bool retain_graph = false);
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph = false);

// Gradients of `outputs` with respect to `inputs` (leaves or intermediate tensors), returned
// instead of accumulated: no .grad is touched. Undefined where an input gets no gradient.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false);

}  // namespace tessel
