// Reduction operators shared by Partial placements and collectives.
#pragma once

#include <cstdint>
#include <string_view>

#include <fmt/format.h>

namespace tessel {

enum class ReduceOp : uint8_t { sum, avg, max, min, prod };

std::string_view reduce_op_name(ReduceOp op);
// Parses "sum", "avg", "max", "min", "prod"; throws naming the text.
ReduceOp parse_reduce_op(std::string_view text);

}  // namespace tessel

template <>
struct fmt::formatter<tessel::ReduceOp> : fmt::formatter<std::string_view> {
  auto format(tessel::ReduceOp op, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(tessel::reduce_op_name(op), ctx);
  }
};
