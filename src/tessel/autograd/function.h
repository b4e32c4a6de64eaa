// Custom differentiable steps for the layers above ops (reshard, pipeline send/recv,
// parameter gathers): record outputs as made from inputs with a backward given as a lambda.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tessel/core/tensor.h"

namespace tessel {

// Gradients of the inputs (one per input, undefined where none) from those of the outputs
// (undefined where no gradient flowed).
using CustomBackward = std::function<std::vector<Tensor>(std::vector<Tensor>&& grad_outputs)>;

// When grad mode is on and an input requires grad, makes `outputs` the outputs of a node
// named `name` whose backward is `fn`. Returns whether it recorded.
bool record_function(std::string name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                     CustomBackward fn);

}  // namespace tessel
