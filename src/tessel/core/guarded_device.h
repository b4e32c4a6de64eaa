// The guarded test device: a device type whose kernels are the CPU's but whose memory the
// host may not touch outside them. Its memory lives in one reserved arena that is mapped
// PROT_NONE except while some KernelScope of the device is open (an op's kernel, a copy):
// code that reads device memory as host memory — the bug a GPU turns into garbage or a fault
// far from its cause — dies with SIGSEGV at the read in CI, where there is no GPU.
//
// Scopes are counted process-wide (page protections are), so while one thread-rank runs a
// kernel another rank's host read goes unnoticed; single-rank runs and a rank's own
// sequential code are checked exactly. Devices guarded:0 ... guarded:7 share the arena, each
// with its own caching allocator (caching_allocator.h), so multi-rank tests can give each
// rank a device of its own. TESSEL_GUARDED_ARENA_GB (default 32) sets the address space
// reserved; only what is allocated is ever backed by memory.
#pragma once

#include <cstddef>

namespace tessel {

inline constexpr int kGuardedDevices = 8;

// Registers the guarded backend (find_device_backend does it on first use of the type).
void install_guarded_device();

// Whether host code may touch guarded memory now (some KernelScope of the device is open).
bool guarded_memory_open();

}  // namespace tessel
