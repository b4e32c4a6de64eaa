// Device implementations of the kernels that no registered op covers — the in-place updates
// (add_, scale_) and the optimizer steps — by name and device type. A device backend's library
// registers its own (the CUDA backend does in ops/cuda/kernels.cc); the callers use them for
// tensors on that device and the CPU's kernel otherwise (kernels::host_kernel).
#pragma once

#include <string_view>

#include "tessel/core/tensor.h"
#include "tessel/ops/update_scalars.h"

namespace tessel {

// dst += alpha · src; src has dst's shape (broadcast) and dtype.
using AddInplaceFn = void (*)(const Tensor& dst, const Tensor& src, double alpha);
// dst *= alpha; dst contiguous.
using ScaleInplaceFn = void (*)(const Tensor& dst, double alpha);
// One AdamW step on contiguous f32 p, g, m, v of one shape (update_scalars.h).
using AdamWFn = void (*)(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const AdamWScalars& k);

void register_device_fn(std::string_view name, DeviceType type, void* fn);
void* find_device_fn(std::string_view name, DeviceType type);  // null: none registered

template <typename Fn>
Fn device_fn(std::string_view name, Device device) {
  return device.is_cpu() ? nullptr : reinterpret_cast<Fn>(find_device_fn(name, device.type));
}

}  // namespace tessel
