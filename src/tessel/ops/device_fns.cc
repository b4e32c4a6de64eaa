// The registry of device functions (device_fns.h).
#include "tessel/ops/device_fns.h"

#include <map>
#include <mutex>
#include <string>

namespace tessel {

namespace {

struct Table {
  std::mutex mutex;
  std::map<std::pair<std::string, int>, void*> fns;
};

Table& table() {
  static auto* t = new Table();
  return *t;
}

}  // namespace

void register_device_fn(std::string_view name, DeviceType type, void* fn) {
  Table& t = table();
  std::lock_guard lock(t.mutex);
  t.fns[{std::string(name), static_cast<int>(type)}] = fn;
}

void* find_device_fn(std::string_view name, DeviceType type) {
  Table& t = table();
  std::lock_guard lock(t.mutex);
  auto it = t.fns.find({std::string(name), static_cast<int>(type)});
  return it == t.fns.end() ? nullptr : it->second;
}

}  // namespace tessel
