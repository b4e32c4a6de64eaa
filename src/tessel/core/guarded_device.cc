// The guarded device (guarded_device.h): an arena of address space whose protection follows
// the open kernel scopes, carved into segments for one caching allocator per device index.
#include "tessel/core/guarded_device.h"

#include <sys/mman.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "tessel/core/caching_allocator.h"
#include "tessel/core/device.h"
#include "tessel/core/error.h"

namespace tessel {

namespace {

// The reserved address space: segments come from a first-fit list of free ranges, and the
// span [base, base + high) ever handed out is what the scopes protect and open.
class Arena {
 public:
  Arena() {
    const char* v = std::getenv("TESSEL_GUARDED_ARENA_GB");
    size_t gb = v != nullptr && *v != '\0' ? static_cast<size_t>(std::atoll(v)) : 32;
    size_ = std::max<size_t>(gb, 1) << 30;
    void* p = ::mmap(nullptr, size_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    TESSEL_CHECK(p != MAP_FAILED, "guarded device: cannot reserve {} GiB of address space: {}", size_ >> 30,
                 std::strerror(errno));
    base_ = static_cast<char*>(p);
    free_[0] = size_;
  }

  void* allocate(size_t nbytes) {
    std::lock_guard lock(mutex_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < nbytes) continue;
      size_t at = it->first, left = it->second - nbytes;
      free_.erase(it);
      if (left > 0) free_[at + nbytes] = left;
      if (at + nbytes > high_) {
        size_t old = high_;
        high_ = at + nbytes;
        if (open_ > 0) protect(old, high_ - old, PROT_READ | PROT_WRITE);
      }
      return base_ + at;
    }
    return nullptr;
  }

  void free(void* ptr, size_t nbytes) {
    std::lock_guard lock(mutex_);
    size_t at = static_cast<size_t>(static_cast<char*>(ptr) - base_);
    ::madvise(ptr, nbytes, MADV_DONTNEED);  // give the pages back; the range stays reserved
    auto next = free_.lower_bound(at);
    if (next != free_.end() && next->first == at + nbytes) {
      nbytes += next->second;
      free_.erase(next);
    }
    auto prev = free_.lower_bound(at);
    if (prev != free_.begin()) {
      --prev;
      if (prev->first + prev->second == at) {
        prev->second += nbytes;
        return;
      }
    }
    free_[at] = nbytes;
  }

  void open() {
    std::lock_guard lock(mutex_);
    if (open_++ == 0 && high_ > 0) protect(0, high_, PROT_READ | PROT_WRITE);
  }

  void close() {
    std::lock_guard lock(mutex_);
    TESSEL_ASSERT(open_ > 0, "guarded device: a kernel scope closed more often than opened");
    if (--open_ == 0 && high_ > 0) protect(0, high_, PROT_NONE);
  }

  bool is_open() {
    std::lock_guard lock(mutex_);
    return open_ > 0;
  }

 private:
  void protect(size_t at, size_t n, int prot) {
    TESSEL_ASSERT(::mprotect(base_ + at, n, prot) == 0, "guarded device: mprotect failed: {}", std::strerror(errno));
  }

  std::mutex mutex_;
  char* base_ = nullptr;
  size_t size_ = 0, high_ = 0;
  std::map<size_t, size_t> free_;  // offset -> length
  int open_ = 0;
};

Arena& arena() {
  static auto* a = new Arena();  // never destroyed: storages may outlive static destruction
  return *a;
}

class ArenaSegments final : public SegmentSource {
 public:
  explicit ArenaSegments(int index) : index_(index) {}
  void* allocate_segment(size_t nbytes) override { return arena().allocate(nbytes); }
  void free_segment(void* ptr, size_t nbytes) override { arena().free(ptr, nbytes); }
  std::string device_name() const override { return Device{DeviceType::guarded, index_}.str(); }

 private:
  int index_;
};

class GuardedBackend final : public DeviceBackend {
 public:
  GuardedBackend() {
    for (int i = 0; i < kGuardedDevices; ++i) allocators_[i] = std::make_unique<CachingAllocator>(std::make_unique<ArenaSegments>(i));
  }
  DeviceType type() const override { return DeviceType::guarded; }
  int device_count() const override { return kGuardedDevices; }
  Allocator& allocator(int index) override { return *allocators_[index]; }
  bool runs_cpu_kernels() const override { return true; }
  void copy_bytes(void* dst, Device, const void* src, Device, size_t nbytes, Stream) override {
    if (nbytes == 0) return;
    arena().open();
    std::memcpy(dst, src, nbytes);
    arena().close();
  }
  void enter_kernel(int) override { arena().open(); }
  void exit_kernel(int) override { arena().close(); }
  std::string describe(int index) const override {
    return fmt::format("guarded test device {} (CPU kernels; memory readable only inside them)", index);
  }

 private:
  std::array<std::unique_ptr<CachingAllocator>, kGuardedDevices> allocators_;
};

}  // namespace

void install_guarded_device() {
  static std::once_flag once;
  std::call_once(once, [] {
    arena();
    register_device_backend(new GuardedBackend());  // lives for the process
  });
}

bool guarded_memory_open() { return arena().is_open(); }

}  // namespace tessel
