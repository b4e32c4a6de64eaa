// Lookup over every registered op.
#pragma once

#include <optional>
#include <span>
#include <vector>
#include <string>
#include <string_view>

#include "tessel/core/attrs.h"
#include "tessel/ops/op.h"

namespace tessel {

// Every op, in registry order.
std::span<const OpDef* const> all_ops();
// The op called `name`, or null.
const OpDef* find_op(std::string_view name);
// The op called `name`; throws listing close names when absent.
const OpDef& op_by_name(std::string_view name);

// One attribute of an op's signature (OpDef::attrs, parsed).
struct AttrSpec {
  std::string name;
  std::string type;                    // int, float, bool, ints, str, dtype
  std::optional<AttrValue> fallback;   // the default; none: required, or optional when `internal`
  bool internal = false;               // "name: type?": set by the dist layer or internal callers
};
// `op`'s attributes from its OpDef::attrs, parsed once; throws InternalError naming the op on a
// malformed signature (tests parse every op's).
const std::vector<AttrSpec>& op_attr_specs(const OpDef& op);

// Kernels by device type — Paddle's kernel registry keyed by backend, ggml-backend's
// supports_op. An OpDef's `forward` and `backward` are its CPU kernels; a device backend's
// library registers its own for the ops it implements when it loads. A device that runs CPU
// kernels (the guarded test device) uses the CPU's for every op it has none of its own for.
// A registered kernel without a backward uses the OpDef's when `composite_backward` says that
// backward only calls other ops (which dispatch by device themselves); else the op has no
// backward on that device and a backward through it fails naming the op and the device.
struct DeviceKernel {
  ForwardFn forward = nullptr;
  BackwardFn backward = nullptr;
  bool composite_backward = false;
};
void register_kernel(const OpDef& op, DeviceType type, DeviceKernel kernel);
// The kernel registered for `op` on `type` (the CPU's from the OpDef), or null.
const DeviceKernel* find_kernel(const OpDef& op, DeviceType type);
// Whether `op` can run on `device`: a kernel of its type, or CPU kernels it runs.
bool supports_op(const OpDef& op, Device device);
// "cpu, cuda": the device types `op` has kernels of, for messages.
std::string kernel_types(const OpDef& op);

}  // namespace tessel
