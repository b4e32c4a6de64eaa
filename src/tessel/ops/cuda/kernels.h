// The CUDA backend with the ops' CUDA kernels. A binary that wants GPUs calls install() once
// (the CLI does at start when built with CUDA): it registers the device backend
// (core/cuda/cuda_device.h) and every CUDA kernel into the op registry.
#pragma once

namespace tessel::cuda {

void install();

}  // namespace tessel::cuda
