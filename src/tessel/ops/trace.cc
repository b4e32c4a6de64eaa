// The per-rank op trace of meta mode and the backward costs it charges.
#include "tessel/ops/trace.h"

#include <algorithm>
#include <memory>

#include "tessel/core/context.h"
#include "tessel/ops/dispatch.h"

namespace tessel {

double OpTrace::flops() const {
  double f = 0;
  for (const auto* side : {&forward, &backward})
    for (const auto& [name, t] : *side) f += t.flops;
  return f;
}

double OpTrace::bytes() const {
  double b = 0;
  for (const auto* side : {&forward, &backward})
    for (const auto& [name, t] : *side) b += t.bytes;
  return b;
}

double OpTrace::bytes(std::string_view op) const {
  double b = 0;
  for (const auto* side : {&forward, &backward})
    if (auto it = side->find(std::string(op)); it != side->end()) b += it->second.bytes;
  return b;
}

OpTraceScope::OpTraceScope() : previous_(rank_context().trace_ops) { rank_context().trace_ops = true; }
OpTraceScope::~OpTraceScope() { rank_context().trace_ops = previous_; }

bool tracing_ops() {
  const RankContext& ctx = rank_context();
  return (ctx.meta || ctx.trace_ops) && ctx.op_backward_depth == 0;
}

OpTrace& op_trace() {
  RankContext& ctx = rank_context();
  std::shared_ptr<OpTrace> t = ctx.get_ext<OpTrace>();
  if (!t) {
    t = std::make_shared<OpTrace>();
    ctx.set_ext(t);
  }
  return *t;
}

void reset_op_trace() { op_trace() = OpTrace{}; }

void trace_cost(std::string_view op, Cost c, bool backward, std::array<double, 4> product) {
  OpTrace& t = op_trace();
  backward = backward || rank_context().summing_grads;  // the autograd engine's gradient sums
  OpTally& x = (backward ? t.backward : t.forward)[std::string(op)];
  ++x.calls;
  x.flops += c.flops;
  x.bytes += c.bytes;
  const bool recompute = !backward && rank_context().backward_depth > 0;
  t.calls.push_back(OpCallRecord{std::string(op), backward, recompute, c, product[0], product[1], product[2], product[3]});
}

std::array<double, 4> product_sizes(const OpDef& op, std::span<const TensorMeta> inputs, const Attrs& attrs) {
  if (inputs.size() < 2) return {0, 0, 0, 0};
  auto d = [](const Shape& s, size_t from_end) { return static_cast<double>(s[s.size() - from_end]); };
  const std::string_view n = op.name;
  if (n == "linear") {  // x [.., in], weight [out, in] (or [in, out..])
    const Shape& x = inputs[0].shape;
    const double in = std::max(d(x, 1), 1.0);
    return {static_cast<double>(shape_numel(x)) / in, static_cast<double>(shape_numel(inputs[1].shape)) / in, in, 1};
  }
  if (n == "matmul") {  // a [.., M, K] (or [.., K, M]), b [.., K, N] (or [.., N, K])
    const Shape& a = inputs[0].shape;
    const Shape& b = inputs[1].shape;
    const bool ta = attrs.b_or("trans_a", false), tb = attrs.b_or("trans_b", false);
    const double batch = static_cast<double>(shape_numel(a)) / (d(a, 1) * d(a, 2));
    return {ta ? d(a, 1) : d(a, 2), tb ? d(b, 2) : d(b, 1), ta ? d(a, 2) : d(a, 1), batch};
  }
  if (n == "grouped_matmul") {  // x [rows, k] over the groups' weights: about rows / groups each
    const Shape& x = inputs[0].shape;
    const Shape& w = inputs[1].shape;
    const double groups = static_cast<double>(w[0]);
    const double out = attrs.b_or("trans_w", false) ? static_cast<double>(w[1]) : static_cast<double>(w[2]);
    return {static_cast<double>(x[0]) / std::max(groups, 1.0), out, static_cast<double>(x[1]), groups};
  }
  if (n == "sdpa") {  // q [b, h, tq, dh], k [b, hkv, tk, dh]
    const Shape& q = inputs[0].shape;
    const Shape& k = inputs[1].shape;
    return {d(q, 2), d(k, 2), d(q, 1), static_cast<double>(shape_numel(q)) / (d(q, 1) * d(q, 2))};
  }
  return {0, 0, 0, 0};
}

Cost backward_cost(const OpDef& op, std::span<const TensorMeta> inputs, std::span<const TensorMeta> outputs,
                   const Attrs& attrs, const std::vector<bool>& needs_grad) {
  const Cost fwd = op.cost ? op.cost(MetaCall{op, inputs, attrs}, outputs) : Cost{};
  int wanted = 0;
  double grad_bytes = 0;
  for (size_t i = 0; i < inputs.size() && i < needs_grad.size(); ++i)
    if (needs_grad[i]) {
      ++wanted;
      grad_bytes += static_cast<double>(inputs[i].nbytes());
    }
  if (wanted == 0) return {};
  Cost c;
  const std::string_view n = op.name;
  if (n == "matmul" || n == "linear" || n == "grouped_matmul") {
    // One product per operand wanting a gradient (the bias's column sum is streaming work).
    int products = 0;
    for (size_t i = 0; i < 2 && i < needs_grad.size(); ++i) products += needs_grad[i] ? 1 : 0;
    c.flops = fwd.flops * products;
    c.bytes = fwd.bytes * products;
  } else if (n == "sdpa") {
    // FlashAttention's backward: QK^T again, dV, dP, dQ, dK: five products to the forward's two.
    c.flops = fwd.flops * 2.5;
    c.bytes = fwd.bytes * 2;
  } else {
    // Read the output gradients and what was saved, write the input gradients.
    c.flops = fwd.flops;
    c.bytes = fwd.bytes + grad_bytes;
  }
  return c;
}

}  // namespace tessel
