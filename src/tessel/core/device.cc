// Device names and the CPU allocator.
#include "tessel/core/device.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <new>

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

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    size_t rounded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
    TESSEL_CHECK(p != nullptr, "out of host memory allocating {} bytes", nbytes);
    return p;
  }
  void deallocate(void* ptr, size_t) override { std::free(ptr); }
};

std::array<std::atomic<Allocator*>, kNumDeviceTypes>& allocators() {
  static CpuAllocator cpu;
  static std::array<std::atomic<Allocator*>, kNumDeviceTypes> table{&cpu, nullptr};
  return table;
}

}  // namespace

Allocator& device_allocator(DeviceType type) {
  Allocator* a = allocators()[static_cast<int>(type)].load();
  TESSEL_CHECK(a != nullptr, "device {} is not available in this build (no allocator registered)",
               Device{type, 0}.str());
  return *a;
}

void register_allocator(DeviceType type, Allocator* allocator) {
  allocators()[static_cast<int>(type)].store(allocator);
}

}  // namespace tessel
