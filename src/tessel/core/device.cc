// Device names, the CPU backend and its allocator, the backend registry, kernel scopes and
// events.
#include "tessel/core/device.h"

#include <array>
#include <atomic>
#include <cstring>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/core/guarded_device.h"

namespace tessel {

const char* device_type_name(DeviceType type) {
  switch (type) {
    case DeviceType::cpu: return "cpu";
    case DeviceType::cuda: return "cuda";
    case DeviceType::guarded: return "guarded";
  }
  return "?";
}

std::string Device::str() const {
  if (type == DeviceType::cpu) return "cpu";
  return fmt::format("{}:{}", device_type_name(type), index);
}

Device Device::parse(std::string_view text) {
  if (text == "cpu") return Device{};
  for (DeviceType type : {DeviceType::cuda, DeviceType::guarded}) {
    std::string_view name = device_type_name(type);
    if (!text.starts_with(name)) continue;
    std::string_view rest = text.substr(name.size());
    if (rest.empty()) return Device{type, 0};
    int index = 0;
    bool digits = rest.size() >= 2 && rest.size() <= 6 && rest[0] == ':';
    for (size_t i = 1; digits && i < rest.size(); ++i) {
      digits = rest[i] >= '0' && rest[i] <= '9';
      index = index * 10 + (rest[i] - '0');
    }
    if (digits) return Device{type, index};
  }
  TESSEL_THROW("unknown device '{}' (expected cpu, cuda, cuda:N, guarded or guarded:N)", text);
}

namespace {

// CPU memory. Blocks of 64 KiB and more are cached by size class when freed and handed out
// again, as training allocates the same activation shapes every step: without the cache each
// large block is a fresh mmap whose pages fault in one by one and are unmapped on free.
// Classes are 8 steps per power of two (at most 12.5% slack). The cache holds at most
// TESSEL_CPU_CACHE_MB (default 2048) of free blocks; sanitizer builds disable it so
// use-after-free stays detectable. Streams mean nothing on the CPU.
class CpuAllocator final : public Allocator {
 public:
  CpuAllocator() {
    const char* v = std::getenv("TESSEL_CPU_CACHE_MB");
    if (v != nullptr && *v != '\0') limit_ = static_cast<size_t>(std::atoll(v)) << 20;
#if defined(__SANITIZE_ADDRESS__)
    limit_ = 0;
#endif
  }

  void* allocate(size_t nbytes, uint64_t /*stream*/) override {
    size_t size = rounded(nbytes);
    std::lock_guard lock(mutex_);
    ++stats_.allocations;
    stats_.allocated += static_cast<int64_t>(size);
    stats_.allocated_peak = std::max(stats_.allocated_peak, stats_.allocated);
    if (size >= kCacheMin) {
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= size;
        ++stats_.cache_hits;
        return p;
      }
    }
    void* p = std::aligned_alloc(kAlignment, size);
    if (p == nullptr) {
      stats_.allocated -= static_cast<int64_t>(size);
      TESSEL_THROW("out of host memory allocating {} bytes", nbytes);
    }
    stats_.reserved += static_cast<int64_t>(size);
    stats_.reserved_peak = std::max(stats_.reserved_peak, stats_.reserved);
    ++stats_.segments;
    return p;
  }

  void deallocate(void* ptr, size_t nbytes, uint64_t /*stream*/) override {
    size_t size = rounded(nbytes);
    std::lock_guard lock(mutex_);
    stats_.allocated -= static_cast<int64_t>(size);
    if (size >= kCacheMin && cached_ + size <= limit_) {
      free_[size].push_back(ptr);
      cached_ += size;
      return;
    }
    stats_.reserved -= static_cast<int64_t>(size);
    --stats_.segments;
    std::free(ptr);
  }

  AllocatorStats stats() const override {
    std::lock_guard lock(mutex_);
    return stats_;
  }

  void reset_peak() override {
    std::lock_guard lock(mutex_);
    stats_.allocated_peak = stats_.allocated;
    stats_.reserved_peak = stats_.reserved;
  }

  void empty_cache() override {
    std::lock_guard lock(mutex_);
    for (auto& [size, list] : free_) {
      for (void* p : list) std::free(p);
      stats_.reserved -= static_cast<int64_t>(size * list.size());
      stats_.segments -= static_cast<int64_t>(list.size());
    }
    free_.clear();
    cached_ = 0;
  }

  size_t cached_bytes() {
    std::lock_guard lock(mutex_);
    return cached_;
  }

 private:
  static constexpr size_t kCacheMin = 64 << 10;

  static size_t rounded(size_t nbytes) {
    size_t n = std::max(nbytes, kAlignment);
    n = (n + kAlignment - 1) / kAlignment * kAlignment;
    if (n < kCacheMin) return n;
    size_t high = size_t{1} << (63 - __builtin_clzll(n));  // largest power of two <= n
    size_t step = high / 8;
    return (n + step - 1) / step * step;
  }

  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
  size_t limit_ = size_t{2048} << 20;
  AllocatorStats stats_;
};

CpuAllocator& cpu_allocator() {
  static auto* a = new CpuAllocator();  // never destroyed: storages may outlive static destruction
  return *a;
}

// The host: memory the host reads directly, copies by memcpy, no streams.
class CpuBackend final : public DeviceBackend {
 public:
  DeviceType type() const override { return DeviceType::cpu; }
  int device_count() const override { return 1; }
  Allocator& allocator(int /*index*/) override { return cpu_allocator(); }
  bool host_accessible() const override { return true; }
  void copy_bytes(void* dst, Device, const void* src, Device, size_t nbytes, Stream) override {
    if (nbytes > 0) std::memcpy(dst, src, nbytes);
  }
  std::string describe(int /*index*/) const override { return "host CPU"; }
};

std::array<std::atomic<DeviceBackend*>, kNumDeviceTypes>& backends() {
  static auto* cpu = new CpuBackend();
  static std::array<std::atomic<DeviceBackend*>, kNumDeviceTypes> table{cpu, nullptr, nullptr};
  return table;
}

}  // namespace

void DeviceBackend::copy_strided(const Tensor&, const Tensor&) {
  TESSEL_THROW("device type {} has no strided copy kernel", device_type_name(type()));
}

void DeviceBackend::fill(const Tensor&, double) {
  TESSEL_THROW("device type {} has no fill kernel", device_type_name(type()));
}

DeviceBackend* find_device_backend(DeviceType type) {
  // The guarded device is core's own; it registers on first use rather than at load, so a
  // program that never names it reserves no address space for it.
  if (type == DeviceType::guarded && backends()[static_cast<int>(type)].load() == nullptr) install_guarded_device();
  return backends()[static_cast<int>(type)].load();
}

DeviceBackend& device_backend(Device device) {
  DeviceBackend* b = find_device_backend(device.type);
  TESSEL_CHECK(b != nullptr, "device {} is not available: this build has no {} backend", device.str(),
               device_type_name(device.type));
  int count = b->device_count();
  TESSEL_CHECK(device.index >= 0 && device.index < count, "device {} is not available: {} {} device{} present",
               device.str(), count, device_type_name(device.type), count == 1 ? "" : "s");
  return *b;
}

void register_device_backend(DeviceBackend* backend) {
  backends()[static_cast<int>(backend->type())].store(backend);
}

Allocator& device_allocator(Device device) {
  if (device.type == DeviceType::cpu) return cpu_allocator();
  return device_backend(device).allocator(device.index);
}

bool host_accessible(Device device) {
  return device.type == DeviceType::cpu || device_backend(device).host_accessible();
}

KernelScope::KernelScope(Device device) : index_(device.index) {
  if (device.type == DeviceType::cpu) return;
  backend_ = &device_backend(device);
  backend_->enter_kernel(index_);
}

KernelScope::~KernelScope() {
  if (backend_ != nullptr) backend_->exit_kernel(index_);
}

Event::Event(Device device) : device_(device) {
  if (!device.is_cpu()) handle_ = device_backend(device).create_event(device.index);
}

Event::~Event() {
  if (handle_ != nullptr) device_backend(device_).destroy_event(device_, handle_);
}

void Event::record(Stream stream) {
  TESSEL_CHECK(stream.device == device_, "Event::record: an event of {} recorded on a stream of {}", device_.str(),
               stream.device.str());
  if (!device_.is_cpu()) device_backend(device_).record_event(handle_, stream);
}

void Event::wait(Stream stream) const {
  if (device_.is_cpu() || handle_ == nullptr) return;
  TESSEL_CHECK(stream.device.type == device_.type, "Event::wait: an event of {} waited on by a stream of {}",
               device_.str(), stream.device.str());
  device_backend(device_).stream_wait_event(stream, handle_);
}

void Event::synchronize() const {
  if (!device_.is_cpu() && handle_ != nullptr) device_backend(device_).synchronize_event(device_, handle_);
}

bool Event::done() const {
  return device_.is_cpu() || handle_ == nullptr || device_backend(device_).event_done(device_, handle_);
}

std::string devices_description() {
  std::string out = "devices: cpu";
  DeviceBackend* cuda = find_device_backend(DeviceType::cuda);
  const int n = cuda != nullptr ? cuda->device_count() : 0;
  if (cuda == nullptr) out += "; no CUDA backend";
  else if (n == 0) out += "; CUDA backend built, no GPU found";
  for (int i = 0; i < n; ++i) out += fmt::format("; cuda:{} {}", i, cuda->describe(i));
  return out;
}

void release_cpu_cache() { cpu_allocator().empty_cache(); }
size_t cpu_cache_bytes() { return cpu_allocator().cached_bytes(); }

}  // namespace tessel
