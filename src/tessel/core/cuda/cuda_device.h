// The CUDA device backend: each GPU's stream-ordered caching allocator (caching_allocator.h
// over cudaMalloc segments), streams and events as CUDA's, copies between host and device
// through pinned staging buffers, and the strided copy and fill kernels. Built only when CMake
// finds a CUDA toolkit (TESSEL_HAVE_CUDA); binaries that want GPUs call install_cuda_backend()
// (the ops' CUDA kernels come with tessel::cuda::install, ops/cuda/kernels.h).
#pragma once

#include <string_view>

#include "tessel/core/device.h"
#include "tessel/core/cuda/launch.h"

namespace tessel::cuda {

// Registers the backend for DeviceType::cuda (once; later calls do nothing). On a machine
// without a GPU or driver it registers too, with no devices: tensors on cuda:N then fail with
// a message that says so.
void install_cuda_backend();

// Number of GPUs the driver shows (0 without a driver).
int device_count();

// Throws tessel::Error naming `what` and CUDA's error when `status` is not cudaSuccess.
void check(int status, std::string_view what);

// Makes `device` the calling thread's current CUDA device.
void activate(Device device);

// The stream kernels for `device` are enqueued on: the rank's current stream when the rank's
// current device is `device`, else the device's default stream.
StreamHandle stream_for(Device device);

// The shape and strides of up to three operands of one shape, for a kernel (throws past
// kMaxDims dims).
Strides strides_of(const Tensor& out, const Tensor* a = nullptr, const Tensor* b = nullptr);

}  // namespace tessel::cuda
