// What a rank's ops did while it ran in meta mode (MetaModeScope), or in a real run inside an
// OpTraceScope: per op, the calls and the FLOPs and bytes of its forwards and of its backwards,
// from the same OpDefs (infer and cost) the kernels run by. Ops an op's backward calls are part
// of that backward, not counted apart. The planner reads compute from here instead of from a
// list of its own; a real run's record is what a trace is checked against.
#pragma once

#include <array>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "tessel/ops/op.h"

namespace tessel {

struct OpTally {
  int64_t calls = 0;
  double flops = 0;
  double bytes = 0;
};

// One traced call. A product (GEMMs; attention's per-head QK^T and PV) also gives its sizes
// m x k times k x n (per batch entry), which decide how near a kernel gets to the peak.
struct OpCallRecord {
  std::string op;
  bool backward = false;
  bool recompute = false;  // a forward run again inside the backward (activation recompute)
  Cost cost;
  double m = 0, n = 0, k = 0;
  double batch = 0;  // products of that size in the call (batched matmul, sdpa's batch x heads)
};

struct OpTrace {
  std::map<std::string, OpTally> forward;   // by op name
  std::map<std::string, OpTally> backward;  // by op name (the backward of that op)
  std::vector<OpCallRecord> calls;          // in order
  double flops() const;
  double bytes() const;
  double bytes(std::string_view op) const;  // of one op's forwards and backwards
};

// Records the ops this rank runs for the scope's lifetime (meta mode always does).
class OpTraceScope {
 public:
  OpTraceScope();
  ~OpTraceScope();
  OpTraceScope(const OpTraceScope&) = delete;
  OpTraceScope& operator=(const OpTraceScope&) = delete;

 private:
  bool previous_;
};
// Whether this rank records its ops now: in meta mode or an OpTraceScope, and not inside an
// op's backward.
bool tracing_ops();

// This rank's trace, kept in its rank context (made on first use).
OpTrace& op_trace();
void reset_op_trace();
// Adds one call of `op` costing `c` to this rank's trace (its forward or its backward side):
// for work done outside run_kernel (the dist layer's own implementations).
void trace_cost(std::string_view op, Cost c, bool backward = false, std::array<double, 4> product = {0, 0, 0, 0});

// The sizes (m, n, k) of the products a call of `op` on `inputs` runs and how many (for sdpa
// the scores' query x key x head-dim, batch x heads of them), or zeros for ops that are not
// products.
std::array<double, 4> product_sizes(const OpDef& op, std::span<const TensorMeta> inputs, const Attrs& attrs);

// The cost of an op's backward: FLOPs of the products it redoes per input wanting a gradient
// (a GEMM's input and weight gradients each cost its forward's FLOPs; fused attention rebuilds
// its scores and runs five products against the forward's two), and for streaming ops the bytes
// of reading the output gradient and the saved tensors and writing the input gradients.
Cost backward_cost(const OpDef& op, std::span<const TensorMeta> inputs, std::span<const TensorMeta> outputs,
                   const Attrs& attrs, const std::vector<bool>& needs_grad);

}  // namespace tessel
