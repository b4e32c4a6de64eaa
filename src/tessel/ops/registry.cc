// The op table, built from op_list.h.
#include "tessel/ops/registry.h"

#include <algorithm>
#include <atomic>
#include <iterator>
#include <optional>
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

namespace {

std::string_view trimmed(std::string_view t) {
  while (!t.empty() && t.front() == ' ') t.remove_prefix(1);
  while (!t.empty() && t.back() == ' ') t.remove_suffix(1);
  return t;
}

AttrValue default_of(const OpDef& op, const std::string& name, const std::string& type, std::string_view text) {
  auto bad = [&] { return InternalError(fmt::format("op '{}': attribute '{}': default '{}' is not a {}", op.name, name, text, type)); };
  const std::string t(text);
  try {
    if (type == "bool") {
      if (t != "true" && t != "false") throw bad();
      return t == "true";
    }
    if (type == "int") {
      size_t used = 0;
      const long long v = std::stoll(t, &used);
      if (used != t.size()) throw bad();
      return static_cast<int64_t>(v);
    }
    if (type == "float") {
      size_t used = 0;
      const double v = std::stod(t, &used);
      if (used != t.size()) throw bad();
      return v;
    }
    if (type == "ints") {
      if (t.size() < 2 || t.front() != '[' || t.back() != ']') throw bad();
      std::vector<int64_t> xs;
      std::string_view body = trimmed(std::string_view(t).substr(1, t.size() - 2));
      while (!body.empty()) {
        const size_t comma = body.find(',');
        const std::string item(trimmed(body.substr(0, comma)));
        size_t used = 0;
        xs.push_back(std::stoll(item, &used));
        if (used != item.size()) throw bad();
        body = comma == std::string_view::npos ? std::string_view() : trimmed(body.substr(comma + 1));
      }
      return xs;
    }
    if (type == "str") return t;
    if (type == "dtype") {
      for (DType d : kAllDTypes)
        if (dtype_name(d) == t) return d;
      throw bad();
    }
  } catch (const std::logic_error&) {
    throw bad();
  }
  throw InternalError(fmt::format("op '{}': attribute '{}' has unknown type '{}'", op.name, name, type));
}

std::vector<AttrSpec> parse_attr_specs(const OpDef& op) {
  std::vector<AttrSpec> out;
  std::string_view rest = op.attrs;
  while (!trimmed(rest).empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = trimmed(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const size_t colon = item.find(':');
    TESSEL_CHECK_AS(InternalError, colon != std::string_view::npos && colon > 0,
                    "op '{}': attribute '{}' is not 'name: type'", op.name, item);
    AttrSpec a;
    a.name = std::string(trimmed(item.substr(0, colon)));
    std::string_view type = trimmed(item.substr(colon + 1));
    std::string_view fallback;
    if (const size_t eq = type.find('='); eq != std::string_view::npos) {
      fallback = trimmed(type.substr(eq + 1));
      type = trimmed(type.substr(0, eq));
    }
    if (!type.empty() && type.back() == '?') {
      a.internal = true;
      type.remove_suffix(1);
    }
    a.type = std::string(type);
    static const char* const kTypes[] = {"int", "float", "bool", "ints", "str", "dtype"};
    TESSEL_CHECK_AS(InternalError, std::find(std::begin(kTypes), std::end(kTypes), a.type) != std::end(kTypes),
                    "op '{}': attribute '{}' has unknown type '{}'", op.name, a.name, a.type);
    for (const AttrSpec& b : out)
      TESSEL_CHECK_AS(InternalError, b.name != a.name, "op '{}': attribute '{}' listed twice", op.name, a.name);
    if (!fallback.empty()) a.fallback = default_of(op, a.name, a.type, fallback);
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace

const std::vector<AttrSpec>& op_attr_specs(const OpDef& op) {
  static std::mutex mutex;
  static std::vector<std::optional<std::vector<AttrSpec>>> parsed(kNumOps);
  const size_t i = op_index(op);
  std::lock_guard lock(mutex);
  if (!parsed[i]) parsed[i] = parse_attr_specs(op);
  return *parsed[i];
}

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
