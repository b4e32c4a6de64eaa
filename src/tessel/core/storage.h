// Storage: a refcounted block of device memory that tensors view. Owned allocations are
// charged to the allocating rank's MemoryStats, so per-rank memory can be reported even when
// ranks are threads of one process.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>

#include "tessel/core/device.h"

namespace tessel {

// Byte counters of one rank (or the process): current and peak live bytes.
struct MemoryStats {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> allocations{0};

  void add(int64_t bytes);
  void sub(int64_t bytes) { current.fetch_sub(bytes, std::memory_order_relaxed); }
  void reset_peak() { peak.store(current.load()); }
};

class Storage {
 public:
  // Owned memory from the device's allocator, charged to the current rank's MemoryStats.
  static std::shared_ptr<Storage> allocate(size_t nbytes, Device device = {});
  // Borrowed memory (an mmap, a foreign buffer); `release` runs when the last view dies.
  static std::shared_ptr<Storage> wrap(void* data, size_t nbytes, Device device, std::function<void()> release);

  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  Storage() = default;
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  std::shared_ptr<MemoryStats> charged_;
  std::function<void()> release_;
};

}  // namespace tessel
