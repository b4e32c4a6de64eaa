// Lookup over every registered op.
#pragma once

#include <span>
#include <string_view>

#include "tessel/ops/op.h"

namespace tessel {

// Every op, in registry order.
std::span<const OpDef* const> all_ops();
// The op called `name`, or null.
const OpDef* find_op(std::string_view name);
// The op called `name`; throws listing close names when absent.
const OpDef& op_by_name(std::string_view name);

}  // namespace tessel
