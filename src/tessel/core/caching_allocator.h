// A stream-ordered caching allocator over any device's memory — the design of PyTorch's CUDA
// caching allocator and of ggml's buffer types: memory comes from the device in large
// segments (cudaMalloc, the guarded device's arena) and is carved into blocks; a freed block
// goes back to its stream's pool, where the next allocation on that stream may take it at
// once (work on one stream runs in order, so nothing still running can touch it). The CUDA
// backend and the guarded device use it, so CI exercises the same code the GPU runs.
//
// Sizes: requests are rounded up to 512 bytes. Blocks of at most 1 MiB come from 2 MiB
// segments (the small pool); larger ones from segments of 20 MiB (requests up to 10 MiB) or
// the request rounded up to 2 MiB (the large pool). A free block larger than a request is
// split when what remains is worth keeping (512 bytes in the small pool, more than 1 MiB in
// the large); a freed block merges with free neighbours of its segment. When the device
// refuses a segment, the cache's whole free segments are given back and the request retried
// once; then the allocation fails naming the device, the request and the counters.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include "tessel/core/device.h"

namespace tessel {

// Where segments come from.
class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  // A segment of `nbytes` (a multiple of 512), or null when the device has no more memory.
  virtual void* allocate_segment(size_t nbytes) = 0;
  virtual void free_segment(void* ptr, size_t nbytes) = 0;
  virtual std::string device_name() const = 0;  // "cuda:0", for messages
};

class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(std::unique_ptr<SegmentSource> source);
  ~CachingAllocator() override;

  void* allocate(size_t nbytes, uint64_t stream) override;
  void deallocate(void* ptr, size_t nbytes, uint64_t stream) override;
  AllocatorStats stats() const override;
  void empty_cache() override;
  void reset_peak() override;

  static constexpr size_t kRound = 512;
  static constexpr size_t kSmallMax = size_t{1} << 20;      // blocks of at most this: small pool
  static constexpr size_t kSmallSegment = size_t{2} << 20;  // segment of the small pool
  static constexpr size_t kMidMax = size_t{10} << 20;       // requests up to this share 20 MiB segments
  static constexpr size_t kMidSegment = size_t{20} << 20;
  static constexpr size_t kLargeRound = size_t{2} << 20;
  // Bytes a request of `nbytes` takes, and the segment made for it when no block is free.
  static size_t block_size(size_t nbytes);
  static size_t segment_size(size_t block);

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    uint64_t stream = 0;
    bool small = false;
    bool in_use = false;
    Block* prev = nullptr;  // neighbours within the segment
    Block* next = nullptr;
  };
  struct Order {  // a pool: by stream, then size, then address
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, Order>;

  Pool& pool_of(bool small) { return small ? small_pool_ : large_pool_; }
  Block* take_free(size_t size, uint64_t stream, bool small);
  Block* new_segment(size_t size, uint64_t stream, bool small);
  void release_free_segments();

  std::unique_ptr<SegmentSource> source_;
  mutable std::mutex mutex_;
  Pool small_pool_, large_pool_;
  std::unordered_map<void*, Block*> in_use_;
  AllocatorStats stats_;
};

}  // namespace tessel
