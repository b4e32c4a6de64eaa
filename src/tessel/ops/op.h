// OpDef: everything about one op in one place — shape/dtype inference, the CPU kernel, the
// backward, the cost and the SPMD rule. Execution (dispatch.h), autograd, distribution and
// the planner all read the same definition. Each op family's file defines its OpDefs; the
// registry (op_list.h) lists them all.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "tessel/core/attrs.h"
#include "tessel/core/tensor.h"
#include "tessel/sharding/spmd.h"

namespace tessel {

struct OpDef;

// Shapes only: what inference, cost and the planner see.
struct MetaCall {
  const OpDef& op;
  std::span<const TensorMeta> inputs;
  const Attrs& attrs;
};

// A forward call on tensors.
struct OpCall {
  const OpDef& op;
  std::span<const Tensor> inputs;
  const Attrs& attrs;
  std::span<const TensorMeta> outputs;  // from infer
};

// A backward call. `inputs`/`outputs` hold the tensors the op saved (undefined otherwise);
// `grad_outputs` are undefined for outputs no gradient flowed to.
struct GradCall {
  const OpDef& op;
  const Attrs& attrs;
  std::span<const Tensor> inputs;
  std::span<const Tensor> outputs;
  std::span<const TensorMeta> input_metas;
  std::span<const Tensor> grad_outputs;
  const std::vector<bool>& needs_grad;  // per input: is a gradient wanted
};

// FLOPs and bytes moved (read + written) of one call, from shapes alone.
struct Cost {
  double flops = 0;
  double bytes = 0;
};

using InferFn = std::vector<TensorMeta> (*)(const MetaCall&);
using ForwardFn = std::vector<Tensor> (*)(const OpCall&);
using BackwardFn = std::vector<Tensor> (*)(const GradCall&);
using CostFn = Cost (*)(const MetaCall&, std::span<const TensorMeta> outputs);

// Which inputs/outputs the backward needs (bit i = input/output i).
struct SaveSpec {
  uint32_t inputs = 0;
  uint32_t outputs = 0;
};
inline constexpr uint32_t kAll = 0xffffffffu;

// What an op computes in under bf16 mixed precision (AutocastScope; the rule of torch.autocast):
// `lower` (products: GEMMs, attention) rounds its f32 inputs to bf16, `f32` (norms, softmax,
// losses, sums: where bf16's 8 bits of mantissa lose too much) widens its bf16 inputs to f32,
// `promote` (everything else) computes in the widest floating dtype among its inputs.
enum class AutocastPolicy : uint8_t { promote, lower, f32 };

struct OpDef {
  std::string_view name;
  int num_inputs = 1;   // -1: variadic (cat)
  int num_outputs = 1;  // visible outputs; -1: decided by infer (split)
  int num_hidden = 0;   // extra outputs kept only for backward (statistics, probabilities)
  InferFn infer = nullptr;
  ForwardFn forward = nullptr;
  BackwardFn backward = nullptr;  // null: not differentiable
  CostFn cost = nullptr;
  SpmdRule spmd = nullptr;  // filled per op by the distributed-tensor work
  SaveSpec save;
  bool bf16_via_f32 = true;  // bf16 inputs are computed in f32 and rounded back
  AutocastPolicy autocast = AutocastPolicy::promote;
  // The attributes callers set, as text: "name: type [= default]" comma-separated, type one of
  // int, float, bool, ints, str, dtype; no default: required; "name: type?": optional, set by
  // the dist layer or an internal caller (an SPMD rule's local attrs). The Python front end
  // builds each op's signature and defaults from it (op_attr_specs in registry.h).
  std::string_view attrs = "";
};

}  // namespace tessel
