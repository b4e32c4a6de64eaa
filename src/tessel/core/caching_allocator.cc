// The stream-ordered caching allocator (caching_allocator.h).
#include "tessel/core/caching_allocator.h"

#include <algorithm>
#include <tuple>

#include "tessel/core/error.h"

namespace tessel {

bool CachingAllocator::Order::operator()(const Block* a, const Block* b) const {
  return std::tie(a->stream, a->size, a->ptr) < std::tie(b->stream, b->size, b->ptr);
}

CachingAllocator::CachingAllocator(std::unique_ptr<SegmentSource> source) : source_(std::move(source)) {}

CachingAllocator::~CachingAllocator() {
  // Blocks still in use belong to storages that outlive the allocator (process exit); their
  // segments stay. Whole free segments go back.
  release_free_segments();
}

size_t CachingAllocator::block_size(size_t nbytes) {
  if (nbytes < kRound) return kRound;
  return (nbytes + kRound - 1) / kRound * kRound;
}

size_t CachingAllocator::segment_size(size_t block) {
  if (block <= kSmallMax) return kSmallSegment;
  if (block <= kMidMax) return kMidSegment;
  return (block + kLargeRound - 1) / kLargeRound * kLargeRound;
}

CachingAllocator::Block* CachingAllocator::take_free(size_t size, uint64_t stream, bool small) {
  Pool& pool = pool_of(small);
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  pool.erase(it);
  return b;
}

CachingAllocator::Block* CachingAllocator::new_segment(size_t size, uint64_t stream, bool small) {
  size_t seg = segment_size(size);
  void* p = source_->allocate_segment(seg);
  if (p == nullptr) {
    release_free_segments();
    p = source_->allocate_segment(seg);
  }
  if (p == nullptr)
    TESSEL_THROW(
        "out of memory on {}: tried to allocate {} bytes (a {}-byte segment); {} bytes allocated, {} reserved in {} "
        "segments",
        source_->device_name(), size, seg, stats_.allocated, stats_.reserved, stats_.segments);
  auto* b = new Block();
  b->ptr = static_cast<char*>(p);
  b->size = seg;
  b->stream = stream;
  b->small = small;
  stats_.reserved += static_cast<int64_t>(seg);
  stats_.reserved_peak = std::max(stats_.reserved_peak, stats_.reserved);
  ++stats_.segments;
  return b;
}

void* CachingAllocator::allocate(size_t nbytes, uint64_t stream) {
  const size_t size = block_size(nbytes);
  const bool small = size <= kSmallMax;
  std::lock_guard lock(mutex_);
  ++stats_.allocations;
  Block* b = take_free(size, stream, small);
  if (b != nullptr) {
    ++stats_.cache_hits;
  } else {
    b = new_segment(size, stream, small);
  }
  // Split off the rest when it is worth keeping as a block of its own.
  const size_t rest = b->size - size;
  if (small ? rest >= kRound : rest > kSmallMax) {
    auto* r = new Block();
    r->ptr = b->ptr + size;
    r->size = rest;
    r->stream = stream;
    r->small = small;
    r->prev = b;
    r->next = b->next;
    if (b->next != nullptr) b->next->prev = r;
    b->next = r;
    b->size = size;
    pool_of(small).insert(r);
    ++stats_.splits;
  }
  b->in_use = true;
  in_use_[b->ptr] = b;
  stats_.allocated += static_cast<int64_t>(b->size);
  stats_.allocated_peak = std::max(stats_.allocated_peak, stats_.allocated);
  return b->ptr;
}

void CachingAllocator::deallocate(void* ptr, size_t /*nbytes*/, uint64_t /*stream*/) {
  if (ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  auto it = in_use_.find(ptr);
  TESSEL_ASSERT(it != in_use_.end(), "{}: free of {} which this allocator did not hand out", source_->device_name(),
                ptr);
  Block* b = it->second;
  in_use_.erase(it);
  b->in_use = false;
  stats_.allocated -= static_cast<int64_t>(b->size);
  Pool& pool = pool_of(b->small);
  // Merge with free neighbours (one segment holds one stream's blocks).
  if (b->prev != nullptr && !b->prev->in_use) {
    Block* p = b->prev;
    pool.erase(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next != nullptr) b->next->prev = p;
    delete b;
    b = p;
  }
  if (b->next != nullptr && !b->next->in_use) {
    Block* n = b->next;
    pool.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next != nullptr) n->next->prev = b;
    delete n;
  }
  pool.insert(b);
}

void CachingAllocator::release_free_segments() {
  for (Pool* pool : {&small_pool_, &large_pool_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it;
      if (b->prev == nullptr && b->next == nullptr) {  // a whole segment, free
        source_->free_segment(b->ptr, b->size);
        stats_.reserved -= static_cast<int64_t>(b->size);
        --stats_.segments;
        delete b;
        it = pool->erase(it);
      } else {
        ++it;
      }
    }
  }
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  release_free_segments();
}

void CachingAllocator::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.allocated_peak = stats_.allocated;
  stats_.reserved_peak = stats_.reserved;
}

}  // namespace tessel
