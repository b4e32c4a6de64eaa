// Device names and the CPU allocator.
#include "tessel/core/device.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "tessel/core/error.h"

namespace tessel {

std::string Device::str() const {
  if (type == DeviceType::cpu) return "cpu";
  return fmt::format("cuda:{}", index);
}

Device Device::parse(std::string_view text) {
  if (text == "cpu") return Device{};
  if (text.starts_with("cuda")) {
    int index = 0;
    if (text.size() > 5 && text[4] == ':') index = std::atoi(std::string(text.substr(5)).c_str());
    return Device{DeviceType::cuda, index};
  }
  TESSEL_THROW("unknown device '{}' (expected cpu or cuda:N)", text);
}

namespace {

// CPU memory. Blocks of 64 KiB and more are cached by size class when freed and handed out
// again, as training allocates the same activation shapes every step: without the cache each
// large block is a fresh mmap whose pages fault in one by one and are unmapped on free.
// Classes are 8 steps per power of two (at most 12.5% slack). The cache holds at most
// TESSEL_CPU_CACHE_MB (default 2048) of free blocks; sanitizer builds disable it so
// use-after-free stays detectable.
class CpuAllocator final : public Allocator {
 public:
  CpuAllocator() {
    const char* v = std::getenv("TESSEL_CPU_CACHE_MB");
    if (v != nullptr && *v != '\0') limit_ = static_cast<size_t>(std::atoll(v)) << 20;
#if defined(__SANITIZE_ADDRESS__)
    limit_ = 0;
#endif
  }

  void* allocate(size_t nbytes) override {
    size_t size = rounded(nbytes);
    if (size >= kCacheMin) {
      std::lock_guard lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= size;
        return p;
      }
    }
    void* p = std::aligned_alloc(kAlignment, size);
    TESSEL_CHECK(p != nullptr, "out of host memory allocating {} bytes", nbytes);
    return p;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    size_t size = rounded(nbytes);
    if (size >= kCacheMin) {
      std::lock_guard lock(mutex_);
      if (cached_ + size <= limit_) {
        free_[size].push_back(ptr);
        cached_ += size;
        return;
      }
    }
    std::free(ptr);
  }

  void release_cache() {
    std::lock_guard lock(mutex_);
    for (auto& [size, list] : free_)
      for (void* p : list) std::free(p);
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

  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
  size_t limit_ = size_t{2048} << 20;
};

CpuAllocator& cpu_allocator() {
  static auto* a = new CpuAllocator();  // never destroyed: storages may outlive static destruction
  return *a;
}

std::array<std::atomic<Allocator*>, kNumDeviceTypes>& allocators() {
  static std::array<std::atomic<Allocator*>, kNumDeviceTypes> table{&cpu_allocator(), nullptr};
  return table;
}

}  // namespace

Allocator& device_allocator(DeviceType type) {
  Allocator* a = allocators()[static_cast<int>(type)].load();
  TESSEL_CHECK(a != nullptr, "device {} is not available in this build (no allocator registered)",
               Device{type, 0}.str());
  return *a;
}

void release_cpu_cache() { cpu_allocator().release_cache(); }
size_t cpu_cache_bytes() { return cpu_allocator().cached_bytes(); }

void register_allocator(DeviceType type, Allocator* allocator) {
  allocators()[static_cast<int>(type)].store(allocator);
}

}  // namespace tessel
