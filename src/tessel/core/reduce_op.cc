// Names of reduction operators.
#include "tessel/core/reduce_op.h"

#include "tessel/core/error.h"

namespace tessel {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
    case ReduceOp::prod: return "prod";
  }
  return "?";
}

ReduceOp parse_reduce_op(std::string_view text) {
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min, ReduceOp::prod})
    if (reduce_op_name(op) == text) return op;
  TESSEL_THROW("unknown reduce op '{}' (expected sum, avg, max, min or prod)", text);
}

}  // namespace tessel
