// Storage allocation, accounting and release.
#include "tessel/core/storage.h"

#include "tessel/core/context.h"
#include "tessel/core/error.h"

namespace tessel {

namespace {

void raise_to(std::atomic<int64_t>& peak, int64_t now) {
  int64_t p = peak.load(std::memory_order_relaxed);
  while (now > p && !peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
  }
}

}  // namespace

const char* memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::other: return "other";
    case MemoryKind::params: return "parameters";
    case MemoryKind::grads: return "gradients";
    case MemoryKind::optimizer: return "optimizer states";
  }
  return "?";
}

void MemoryStats::add(int64_t bytes, MemoryKind kind) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  raise_to(peak, current.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  std::atomic<int64_t>& k = kind_current[static_cast<int>(kind)];
  raise_to(kind_peak[static_cast<int>(kind)], k.fetch_add(bytes, std::memory_order_relaxed) + bytes);
}

void MemoryStats::sub(int64_t bytes, MemoryKind kind) {
  current.fetch_sub(bytes, std::memory_order_relaxed);
  kind_current[static_cast<int>(kind)].fetch_sub(bytes, std::memory_order_relaxed);
}

void MemoryStats::reset_peak() {
  peak.store(current.load());
  for (int k = 0; k < kMemoryKinds; ++k) kind_peak[k].store(kind_current[k].load());
}

void Storage::charge_as(MemoryKind kind) {
  if (kind == kind_) return;
  if (charged_) {
    const auto n = static_cast<int64_t>(nbytes_);
    charged_->kind_current[static_cast<int>(kind_)].fetch_sub(n, std::memory_order_relaxed);
    std::atomic<int64_t>& k = charged_->kind_current[static_cast<int>(kind)];
    raise_to(charged_->kind_peak[static_cast<int>(kind)], k.fetch_add(n, std::memory_order_relaxed) + n);
  }
  kind_ = kind;
}

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device device) {
  std::shared_ptr<Storage> s(new Storage());
  const RankContext& ctx = rank_context();
  s->meta_ = ctx.meta;
  s->stream_ = ctx.device == device ? ctx.stream : 0;
  if (!s->meta_) s->data_ = device_allocator(device).allocate(nbytes, s->stream_);
  s->nbytes_ = nbytes;
  s->device_ = device;
  s->charged_ = ctx.memory;
  s->kind_ = ctx.memory_kind;
  if (s->charged_) s->charged_->add(static_cast<int64_t>(nbytes), s->kind_);
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

void Storage::release() {
  TESSEL_CHECK(!release_, "release: a borrowed storage cannot give its memory back");
  if (released_) return;
  if (data_ != nullptr) device_allocator(device_).deallocate(data_, nbytes_, stream_);
  data_ = nullptr;
  if (charged_) charged_->sub(static_cast<int64_t>(nbytes_), kind_);
  released_ = true;
}

void Storage::restore() {
  if (!released_) return;
  if (!meta_) data_ = device_allocator(device_).allocate(nbytes_, stream_);
  if (charged_) charged_->add(static_cast<int64_t>(nbytes_), kind_);
  released_ = false;
}

Storage::~Storage() {
  if (release_) {
    release_();
    return;
  }
  if (released_) return;
  if (data_ != nullptr) device_allocator(device_).deallocate(data_, nbytes_, stream_);
  if (charged_) charged_->sub(static_cast<int64_t>(nbytes_), kind_);
}

}  // namespace tessel
