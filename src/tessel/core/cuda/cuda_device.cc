// The CUDA device backend (cuda_device.h).
#include "tessel/core/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <array>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "tessel/core/caching_allocator.h"
#include "tessel/core/context.h"
#include "tessel/core/error.h"
#include "tessel/core/tensor.h"

namespace tessel::cuda {

void check(int status, std::string_view what) {
  auto e = static_cast<cudaError_t>(status);
  if (e == cudaSuccess) return;
  TESSEL_THROW("CUDA error in {}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

int device_count() {
  static const int n = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      (void)cudaGetLastError();  // no driver or no device: clear the sticky error
      return 0;
    }
    return count;
  }();
  return n;
}

void activate(Device device) {
  thread_local int current = -1;
  if (current == device.index) return;
  check(cudaSetDevice(device.index), fmt::format("cudaSetDevice({})", device.index));
  current = device.index;
}

StreamHandle stream_for(Device device) {
  const RankContext& ctx = rank_context();
  return ctx.device == device ? reinterpret_cast<StreamHandle>(ctx.stream) : nullptr;
}

Strides strides_of(const Tensor& out, const Tensor* a, const Tensor* b) {
  TESSEL_CHECK(out.dim() <= kMaxDims, "CUDA kernels take at most {} dims; tensor {} has {}", kMaxDims, out.str(),
               out.dim());
  Strides s;
  s.ndim = static_cast<int>(out.dim());
  const Tensor* ops[3] = {&out, a, b};
  for (int d = 0; d < s.ndim; ++d) {
    s.shape[d] = out.shape()[static_cast<size_t>(d)];
    for (int k = 0; k < 3; ++k)
      if (ops[k] != nullptr) s.stride[k][d] = ops[k]->strides()[static_cast<size_t>(d)];
  }
  return s;
}

namespace {

// Segments straight from cudaMalloc on one GPU; null when it is full.
class CudaSegments final : public SegmentSource {
 public:
  explicit CudaSegments(int index) : index_(index) {}
  void* allocate_segment(size_t nbytes) override {
    activate(Device{DeviceType::cuda, index_});
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, nbytes);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    check(e, fmt::format("cudaMalloc of {} bytes on cuda:{}", nbytes, index_));
    return p;
  }
  void free_segment(void* ptr, size_t) override {
    activate(Device{DeviceType::cuda, index_});
    check(cudaFree(ptr), "cudaFree");
  }
  std::string device_name() const override { return Device{DeviceType::cuda, index_}.str(); }

 private:
  int index_;
};

// Pinned host buffers that pageable host memory is staged through, two per GPU so that
// filling one overlaps the copy of the other.
class Staging {
 public:
  static constexpr size_t kChunk = size_t{8} << 20;

  // Copies nbytes between pageable host memory and the device (`to_device` says which way)
  // on `stream`, chunk by chunk; returns when the host side may be reused.
  void copy(void* dst, const void* src, size_t nbytes, bool to_device, cudaStream_t stream) {
    std::lock_guard lock(mutex_);
    if (buffers_[0] == nullptr)
      for (int i = 0; i < 2; ++i) {
        check(cudaMallocHost(&buffers_[i], kChunk), "cudaMallocHost (staging)");
        check(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming), "cudaEventCreate (staging)");
      }
    int k = 0;
    for (size_t at = 0; at < nbytes; at += kChunk, k ^= 1) {
      size_t n = std::min(kChunk, nbytes - at);
      check(cudaEventSynchronize(done_[k]), "staging wait");  // the buffer's last copy is done
      if (to_device) {
        std::memcpy(buffers_[k], static_cast<const char*>(src) + at, n);
        check(cudaMemcpyAsync(static_cast<char*>(dst) + at, buffers_[k], n, cudaMemcpyHostToDevice, stream),
              "cudaMemcpyAsync host to device");
        check(cudaEventRecord(done_[k], stream), "staging record");
      } else {
        check(cudaMemcpyAsync(buffers_[k], static_cast<const char*>(src) + at, n, cudaMemcpyDeviceToHost, stream),
              "cudaMemcpyAsync device to host");
        check(cudaStreamSynchronize(stream), "staging sync");
        std::memcpy(static_cast<char*>(dst) + at, buffers_[k], n);
      }
    }
    if (to_device) check(cudaStreamSynchronize(stream), "staging sync");
  }

 private:
  std::mutex mutex_;
  void* buffers_[2] = {nullptr, nullptr};
  cudaEvent_t done_[2] = {nullptr, nullptr};
};

bool is_pinned(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeHost;
}

cudaStream_t native(Stream s) { return reinterpret_cast<cudaStream_t>(s.id); }

class CudaBackend final : public DeviceBackend {
 public:
  CudaBackend() {
    int n = device_count();
    allocators_.resize(static_cast<size_t>(n));
    staging_.resize(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      allocators_[static_cast<size_t>(i)] = std::make_unique<CachingAllocator>(std::make_unique<CudaSegments>(i));
      staging_[static_cast<size_t>(i)] = std::make_unique<Staging>();
    }
  }
  DeviceType type() const override { return DeviceType::cuda; }
  int device_count() const override { return static_cast<int>(allocators_.size()); }
  Allocator& allocator(int index) override { return *allocators_[static_cast<size_t>(index)]; }

  void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes,
                  Stream stream) override {
    if (nbytes == 0) return;
    Device d = dst_device.is_cpu() ? src_device : dst_device;
    activate(d);
    cudaStream_t s = stream.device == d ? native(stream) : nullptr;
    if (!dst_device.is_cpu() && !src_device.is_cpu()) {  // device to device (peer copies between GPUs)
      check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, s), "cudaMemcpyAsync device to device");
      check(cudaStreamSynchronize(s), "copy sync");
      return;
    }
    const bool to_device = src_device.is_cpu();
    const void* host = to_device ? src : dst;
    if (is_pinned(host)) {
      check(cudaMemcpyAsync(dst, src, nbytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s),
            "cudaMemcpyAsync (pinned)");
      check(cudaStreamSynchronize(s), "copy sync");
      return;
    }
    staging_[static_cast<size_t>(d.index)]->copy(dst, src, nbytes, to_device, s);
  }

  void copy_strided(const Tensor& dst, const Tensor& src) override {
    activate(dst.device());
    Strides s = strides_of(dst, &src);
    launch_copy(dst.raw_data(), static_cast<int>(dst.dtype()), src.raw_data(), static_cast<int>(src.dtype()), s,
                dst.numel(), stream_for(dst.device()));
    check(cudaGetLastError(), "strided copy kernel");
  }

  void fill(const Tensor& t, double value) override {
    activate(t.device());
    launch_fill(t.raw_data(), static_cast<int>(t.dtype()), value, strides_of(t), t.numel(), stream_for(t.device()));
    check(cudaGetLastError(), "fill kernel");
  }

  uint64_t create_stream(int index) override {
    activate(Device{DeviceType::cuda, index});
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    return reinterpret_cast<uint64_t>(s);
  }
  void destroy_stream(Stream stream) override {
    if (stream.id != 0) check(cudaStreamDestroy(native(stream)), "cudaStreamDestroy");
  }
  void synchronize(Stream stream) override {
    activate(stream.device);
    check(cudaStreamSynchronize(native(stream)), "cudaStreamSynchronize");
  }
  void* create_event(int index) override {
    activate(Device{DeviceType::cuda, index});
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    return e;
  }
  void destroy_event(Device, void* event) override { check(cudaEventDestroy(static_cast<cudaEvent_t>(event)), "cudaEventDestroy"); }
  void record_event(void* event, Stream stream) override {
    check(cudaEventRecord(static_cast<cudaEvent_t>(event), native(stream)), "cudaEventRecord");
  }
  void stream_wait_event(Stream stream, void* event) override {
    check(cudaStreamWaitEvent(native(stream), static_cast<cudaEvent_t>(event), 0), "cudaStreamWaitEvent");
  }
  void synchronize_event(Device, void* event) override {
    check(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "cudaEventSynchronize");
  }
  bool event_done(Device, void* event) override {
    cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    check(e, "cudaEventQuery");
    return true;
  }

  std::string describe(int index) const override {
    cudaDeviceProp p{};
    check(cudaGetDeviceProperties(&p, index), "cudaGetDeviceProperties");
    return fmt::format("{} (sm_{}{}, {:.1f} GiB)", p.name, p.major, p.minor,
                       static_cast<double>(p.totalGlobalMem) / static_cast<double>(1 << 30));
  }

 private:
  std::vector<std::unique_ptr<CachingAllocator>> allocators_;
  std::vector<std::unique_ptr<Staging>> staging_;
};

}  // namespace

void install_cuda_backend() {
  static std::once_flag once;
  std::call_once(once, [] { register_device_backend(new CudaBackend()); });  // lives for the process
}

}  // namespace tessel::cuda
