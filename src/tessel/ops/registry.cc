// The op table, built from op_list.h.
#include "tessel/ops/registry.h"

#include "tessel/core/error.h"
#include "tessel/ops/op_list.h"

namespace tessel {

namespace {
#define TESSEL_OP_ADDRESS(name) &op_##name,
constexpr const OpDef* kOps[] = {TESSEL_OP_LIST(TESSEL_OP_ADDRESS)};
#undef TESSEL_OP_ADDRESS
static_assert(sizeof(kOps) / sizeof(kOps[0]) == kNumOps, "op table and op list disagree");
}  // namespace

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
