// Eager distributed dispatch: an op called with distributed inputs applies its SPMD rule,
// reshards its inputs as the rule asks, runs its local kernel on this rank's pieces and returns
// distributed outputs. Backward goes through the same machinery: each recorded call brings its
// output gradients to the layout its local backward needs, runs that backward on the pieces,
// and hands back input gradients in the layout the pieces imply — gradients of replicated
// inputs of a split computation come back Partial, reduced only when something needs them so.
#pragma once

#include <vector>

#include "tessel/ops/op.h"

namespace tessel {

// Installs the handler in the ops layer's dispatcher (done when the first distributed tensor is
// made).
void install_dist_dispatch();

// Runs `op` on inputs of which at least one is distributed (plain inputs count as replicated).
std::vector<Tensor> dist_call(const OpDef& op, std::vector<Tensor>& inputs, const Attrs& attrs);

// Ops the dist layer implements itself (SpmdDecision::custom).
using DistImpl = std::vector<Tensor> (*)(const OpDef& op, std::vector<Tensor>& inputs, const Attrs& attrs,
                                         const SpmdDecision& decision);
void register_dist_impl(std::string_view op, DistImpl impl);

}  // namespace tessel
