// Devices and their allocators. Only the CPU exists today; a CUDA device registers its own
// allocator (and, in ops, its own kernels) without changing anything above this file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessel {

enum class DeviceType : uint8_t { cpu, cuda };
inline constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  bool operator==(const Device&) const = default;
  bool is_cpu() const { return type == DeviceType::cpu; }
  std::string str() const;  // "cpu", "cuda:1"
  static Device parse(std::string_view text);
};

// Memory of one device kind. Implementations must be thread-safe.
class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns `nbytes` of memory aligned to kAlignment (nbytes may be 0); throws on failure.
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
};

inline constexpr size_t kAlignment = 64;

// The allocator of `type`; throws naming the device when none is registered.
Allocator& device_allocator(DeviceType type);
// Frees the CPU allocator's cache of free blocks; its current size in bytes.
void release_cpu_cache();
size_t cpu_cache_bytes();

// Installs the allocator of a device kind (the CUDA backend does this when it loads).
void register_allocator(DeviceType type, Allocator* allocator);

}  // namespace tessel
