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

// What a block of memory holds, for per-kind counters: training state (parameters, their
// gradients, optimizer states) apart from everything else (activations, buffers). A storage is
// charged to the kind current on its rank when allocated (MemoryKindScope) and may be charged
// to another later (Storage::charge_as: a gradient made by an op's backward becomes a leaf's).
enum class MemoryKind : uint8_t { other, params, grads, optimizer };
inline constexpr int kMemoryKinds = 4;
const char* memory_kind_name(MemoryKind kind);

// Byte counters of one rank (or the process): current and peak live bytes, in all and by kind.
struct MemoryStats {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> allocations{0};
  std::atomic<int64_t> kind_current[kMemoryKinds] = {};
  std::atomic<int64_t> kind_peak[kMemoryKinds] = {};

  void add(int64_t bytes, MemoryKind kind = MemoryKind::other);
  void sub(int64_t bytes, MemoryKind kind = MemoryKind::other);
  void reset_peak();
  int64_t current_of(MemoryKind kind) const { return kind_current[static_cast<int>(kind)].load(); }
  int64_t peak_of(MemoryKind kind) const { return kind_peak[static_cast<int>(kind)].load(); }
};

class Storage {
 public:
  // Owned memory from the device's allocator on the rank's current stream, charged to the
  // current rank's MemoryStats.
  static std::shared_ptr<Storage> allocate(size_t nbytes, Device device = {});
  // Borrowed memory (an mmap, a foreign buffer); `release` runs when the last view dies.
  static std::shared_ptr<Storage> wrap(void* data, size_t nbytes, Device device, std::function<void()> release);

  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  MemoryKind kind() const { return kind_; }
  // Moves this storage's bytes to `kind`'s counters.
  void charge_as(MemoryKind kind);
  // Gives an owned block's memory back while the tensors viewing it live on (ZeRO-3 frees a
  // gathered weight between its uses this way); nothing may read or write it until restore()
  // allocates it again, uninitialised. Both are no-ops when already in that state.
  void release();
  void restore();
  bool released() const { return released_; }
  // Made in meta mode: a size with no bytes behind it (data() is null).
  bool meta() const { return meta_; }

 private:
  Storage() = default;
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  uint64_t stream_ = 0;  // the stream it was allocated on (a stream-ordered allocator's pool)
  std::shared_ptr<MemoryStats> charged_;
  MemoryKind kind_ = MemoryKind::other;
  bool released_ = false;
  bool meta_ = false;
  std::function<void()> release_;
};

}  // namespace tessel
