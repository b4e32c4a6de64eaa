// Devices: where a tensor's memory lives, and each device type's backend — its allocators,
// its byte copies, its streams and events, and whether host code may read its memory. The
// CPU and the guarded test device (guarded_device.h) are built into core; the CUDA backend
// registers itself when its library is linked (src/tessel/cuda/). Nothing above this file
// knows which devices exist: it asks the backend of a tensor's device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace tessel {

class Tensor;

enum class DeviceType : uint8_t { cpu, cuda, guarded };
inline constexpr int kNumDeviceTypes = 3;
const char* device_type_name(DeviceType type);  // "cpu", "cuda", "guarded"

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  bool operator==(const Device&) const = default;
  bool is_cpu() const { return type == DeviceType::cpu; }
  std::string str() const;  // "cpu", "cuda:1", "guarded:0"
  // "cpu", "cuda" (= cuda:0), "cuda:N", "guarded", "guarded:N"; throws naming the text.
  static Device parse(std::string_view text);
};

// A queue of work on one device: work enqueued on one stream runs in order; work on two
// streams is ordered only by events. `id` 0 is the device's default stream. The CPU and the
// guarded device run everything when it is enqueued, so their streams are only names.
struct Stream {
  Device device;
  uint64_t id = 0;  // 0: the default stream; else the backend's handle
  bool operator==(const Stream&) const = default;
};

// An allocator's counters, in bytes unless named otherwise.
struct AllocatorStats {
  int64_t allocated = 0, allocated_peak = 0;  // handed out and not yet freed
  int64_t reserved = 0, reserved_peak = 0;    // held from the device (segments), cached or in use
  int64_t allocations = 0;                    // calls to allocate
  int64_t cache_hits = 0;                     // allocations served by a cached block
  int64_t segments = 0;                       // segments held now
  int64_t splits = 0;                         // blocks split off a larger free block
};

// Memory of one device. Implementations are thread-safe.
class Allocator {
 public:
  virtual ~Allocator() = default;
  // `nbytes` (may be 0) aligned to kAlignment, for use on `stream`: a stream-ordered allocator
  // hands a block freed on the same stream to the next allocation on it without waiting, as
  // work on one stream runs in order. Throws tessel::Error naming the device on failure.
  virtual void* allocate(size_t nbytes, uint64_t stream) = 0;
  virtual void deallocate(void* ptr, size_t nbytes, uint64_t stream) = 0;
  virtual AllocatorStats stats() const { return {}; }
  // Gives every cached, unused segment back to the device.
  virtual void empty_cache() {}
  virtual void reset_peak() {}
};

inline constexpr size_t kAlignment = 64;

// One device type's implementation. Everything here may be called from any rank's thread.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual DeviceType type() const = 0;
  // Devices of this type present (0: the type is built in but nothing is attached).
  virtual int device_count() const = 0;
  virtual Allocator& allocator(int index) = 0;
  // Whether host code may read and write this device's memory outside its kernels (the CPU).
  virtual bool host_accessible() const { return false; }
  // A device whose kernels are the CPU's, run inside a KernelScope (the guarded device); the
  // op registry runs those for ops with no kernel of this type.
  virtual bool runs_cpu_kernels() const { return false; }
  // Copies `nbytes` between memory of `dst_device` and `src_device`, at most one of which is a
  // device of another type than cpu. Ordered on `stream` (of the non-cpu device); returns when
  // the host memory involved may be reused (pageable host memory is staged through pinned
  // buffers by the backends that need it).
  virtual void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes,
                          Stream stream) = 0;
  // dst = src (same shape, any strides and dtypes) and t = value on one device of this type:
  // the byte-moving kernels core needs. Unused for a device that runs CPU kernels.
  virtual void copy_strided(const Tensor& dst, const Tensor& src);
  virtual void fill(const Tensor& t, double value);
  // Kernel scopes (see KernelScope): the guarded device opens its memory to the host here.
  virtual void enter_kernel(int /*index*/) {}
  virtual void exit_kernel(int /*index*/) {}
  // Streams and events. The defaults are those of a device that runs work when enqueued.
  virtual uint64_t create_stream(int /*index*/) { return 0; }
  virtual void destroy_stream(Stream /*stream*/) {}
  virtual void synchronize(Stream /*stream*/) {}  // the host waits for `stream`'s work
  virtual void* create_event(int /*index*/) { return nullptr; }
  virtual void destroy_event(Device /*device*/, void* /*event*/) {}
  virtual void record_event(void* /*event*/, Stream /*stream*/) {}
  virtual void stream_wait_event(Stream /*stream*/, void* /*event*/) {}  // the stream waits, not the host
  virtual void synchronize_event(Device /*device*/, void* /*event*/) {}
  virtual bool event_done(Device /*device*/, void* /*event*/) { return true; }
  // "NVIDIA H200 (sm_90, 139.8 GiB)": what `tessel --version` and `cluster detect` print.
  virtual std::string describe(int index) const = 0;
};

// The backend of `type`, or null when this build or machine has none.
DeviceBackend* find_device_backend(DeviceType type);
// The backend of `device`; throws naming the device when it is not available, or when its
// index is past the devices present.
DeviceBackend& device_backend(Device device);
void register_device_backend(DeviceBackend* backend);
// `device`'s allocator (device_backend(device).allocator(device.index)).
Allocator& device_allocator(Device device);
// Whether host code may dereference `device`'s memory.
bool host_accessible(Device device);

// Code that runs as `device`'s kernel: for the scope's lifetime the host may touch the memory
// of `device` (on the guarded device, its memory is readable only inside such scopes). Nests.
class KernelScope {
 public:
  explicit KernelScope(Device device);
  ~KernelScope();
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  DeviceBackend* backend_ = nullptr;
  int index_ = 0;
};

// An event in a stream's work: recorded once or again, waited on by another stream (the
// stream waits) or by the host.
class Event {
 public:
  explicit Event(Device device = {});
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(Stream stream);
  void wait(Stream stream) const;  // `stream` waits for the recorded work; the host does not
  void synchronize() const;        // the host waits
  bool done() const;
  Device device() const { return device_; }

 private:
  Device device_;
  void* handle_ = nullptr;
};

// "devices: cpu; cuda:0 NVIDIA H200 (sm_90, 139.8 GiB)": the devices this process can use —
// the CPU, then each registered backend's devices, or why a backend shows none ("CUDA backend
// built, no GPU found"; a process whose binary does not install CUDA says "no CUDA backend").
std::string devices_description();

// Frees the CPU allocator's cache of free blocks; its current size in bytes.
void release_cpu_cache();
size_t cpu_cache_bytes();

}  // namespace tessel
