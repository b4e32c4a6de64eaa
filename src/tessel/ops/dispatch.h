// Running an op: validate and infer, compute bf16 in f32, run the kernel, and record the call
// on the rank's autograd tape when a gradient is wanted. Distributed inputs are handed to the
// dist layer's handler (installed when the first distributed tensor is made).
#pragma once

#include <span>
#include <vector>

#include "tessel/ops/op.h"

namespace tessel {

// Runs `op` and returns its visible outputs.
std::vector<Tensor> call_op(const OpDef& op, std::vector<Tensor> inputs, const Attrs& attrs = {});
// While set on a thread, call_op throws InternalError for an attribute its op's OpDef::attrs
// does not declare (the op tests run every case so: the signature Python builds is complete).
bool& attr_declaration_check();
// Single-output form.
Tensor call_op1(const OpDef& op, std::vector<Tensor> inputs, const Attrs& attrs = {});

// Output metas (visible then hidden) of `op` on inputs of `metas`; validates like a call.
std::vector<TensorMeta> infer_op(const OpDef& op, std::span<const TensorMeta> metas, const Attrs& attrs = {});
// Cost of `op` on inputs of `metas`.
Cost op_cost(const OpDef& op, std::span<const TensorMeta> metas, const Attrs& attrs = {});

// Runs the op's kernel only: no dist hand-off, no bf16 conversion, no recording. Returns
// visible and hidden outputs. For kernels composed of other ops and for executors.
std::vector<Tensor> run_kernel(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs);

// Runs an op's backward — in meta mode (core/context.h) its cost is traced and the input
// gradients are tensors of the inputs' metas without data. The autograd nodes of plain and
// distributed calls both come here.
std::vector<Tensor> run_backward(const GradCall& call);

// Handler for calls with distributed inputs (set by the dist layer).
using DistDispatchFn = std::vector<Tensor> (*)(const OpDef& op, std::vector<Tensor>& inputs, const Attrs& attrs);
void set_dist_dispatch(DistDispatchFn fn);

}  // namespace tessel
