// The op table, built from op_list.h.
#include "tessel/ops/registry.h"

#include <atomic>
#include <mutex>

#include "tessel/core/error.h"
#include "tessel/ops/op_list.h"

namespace tessel {

namespace {
#define TESSEL_OP_ADDRESS(name) &op_##name,
constexpr const OpDef* kOps[] = {TESSEL_OP_LIST(TESSEL_OP_ADDRESS)};
#undef TESSEL_OP_ADDRESS
static_assert(sizeof(kOps) / sizeof(kOps[0]) == kNumOps, "op table and op list disagree");
size_t op_index(const OpDef& op) {
  for (size_t i = 0; i < kNumOps; ++i)
    if (kOps[i] == &op) return i;
  TESSEL_THROW("op '{}' is not in the registry", op.name);
}

// Kernels of the device types other than the CPU, per op; written when a backend loads.
struct KernelTable {
  std::mutex mutex;
  DeviceKernel kernels[kNumOps][kNumDeviceTypes] = {};
  std::atomic<bool> present[kNumOps][kNumDeviceTypes] = {};
};

KernelTable& kernel_table() {
  static auto* t = new KernelTable();
  return *t;
}

}  // namespace

void register_kernel(const OpDef& op, DeviceType type, DeviceKernel kernel) {
  TESSEL_CHECK(type != DeviceType::cpu, "register_kernel: {}'s CPU kernels are its OpDef's", op.name);
  TESSEL_CHECK(kernel.forward != nullptr, "register_kernel: {} on {} without a forward kernel", op.name,
               device_type_name(type));
  KernelTable& t = kernel_table();
  size_t i = op_index(op);
  std::lock_guard lock(t.mutex);
  t.kernels[i][static_cast<int>(type)] = kernel;
  t.present[i][static_cast<int>(type)].store(true, std::memory_order_release);
}

const DeviceKernel* find_kernel(const OpDef& op, DeviceType type) {
  if (type == DeviceType::cpu) {
    thread_local DeviceKernel cpu;  // the OpDef's own, in the table's shape
    cpu = DeviceKernel{op.forward, op.backward};
    return &cpu;
  }
  KernelTable& t = kernel_table();
  size_t i = op_index(op);
  if (!t.present[i][static_cast<int>(type)].load(std::memory_order_acquire)) return nullptr;
  return &t.kernels[i][static_cast<int>(type)];
}

bool supports_op(const OpDef& op, Device device) {
  if (find_kernel(op, device.type) != nullptr) return true;
  DeviceBackend* b = find_device_backend(device.type);
  return b != nullptr && b->runs_cpu_kernels();
}

std::string kernel_types(const OpDef& op) {
  std::string out = "cpu";
  for (int d = 1; d < kNumDeviceTypes; ++d)
    if (find_kernel(op, static_cast<DeviceType>(d)) != nullptr)
      out += fmt::format(", {}", device_type_name(static_cast<DeviceType>(d)));
  return out;
}

std::span<const OpDef* const> all_ops() { return kOps; }

const OpDef* find_op(std::string_view name) {
  for (const OpDef* op : kOps)
    if (op->name == name) return op;
  return nullptr;
}

const OpDef& op_by_name(std::string_view name) {
  const OpDef* op = find_op(name);
  if (op == nullptr) {
    std::string names;
    for (const OpDef* o : kOps) names += fmt::format("{}{}", names.empty() ? "" : ", ", o->name);
    TESSEL_THROW("unknown op '{}' (registered: {})", name, names);
  }
  return *op;
}

}  // namespace tessel
