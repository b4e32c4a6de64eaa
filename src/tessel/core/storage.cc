// Storage allocation, accounting and release.
#include "tessel/core/storage.h"

#include "tessel/core/context.h"

namespace tessel {

void MemoryStats::add(int64_t bytes) {
  int64_t now = current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  allocations.fetch_add(1, std::memory_order_relaxed);
  int64_t p = peak.load(std::memory_order_relaxed);
  while (now > p && !peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
  }
}

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device device) {
  std::shared_ptr<Storage> s(new Storage());
  s->data_ = device_allocator(device.type).allocate(nbytes);
  s->nbytes_ = nbytes;
  s->device_ = device;
  s->charged_ = rank_context().memory;
  if (s->charged_) s->charged_->add(static_cast<int64_t>(nbytes));
  return s;
}

std::shared_ptr<Storage> Storage::wrap(void* data, size_t nbytes, Device device, std::function<void()> release) {
  std::shared_ptr<Storage> s(new Storage());
  s->data_ = data;
  s->nbytes_ = nbytes;
  s->device_ = device;
  s->release_ = std::move(release);
  return s;
}

Storage::~Storage() {
  if (release_) {
    release_();
    return;
  }
  if (data_ != nullptr) device_allocator(device_.type).deallocate(data_, nbytes_);
  if (charged_) charged_->sub(static_cast<int64_t>(nbytes_));
}

}  // namespace tessel
