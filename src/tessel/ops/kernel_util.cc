// Kernel helpers.
#include "tessel/ops/kernel_util.h"

#include "tessel/ops/reduce.h"
#include "tessel/ops/shape.h"

namespace tessel::kernels {

std::string inputs_str(const MetaCall& call) {
  std::string out;
  for (const TensorMeta& m : call.inputs) out += (out.empty() ? "" : ", ") + m.str();
  return out;
}

void check_floating(const MetaCall& call, size_t i) {
  TESSEL_CHECK(is_floating(call.inputs[i].dtype), "{}: input {} has dtype {}; expected a floating dtype (inputs: {})",
               call.op.name, i, call.inputs[i].dtype, inputs_str(call));
}

void check_same_dtype(const MetaCall& call, size_t i, size_t j) {
  TESSEL_CHECK(call.inputs[i].dtype == call.inputs[j].dtype, "{}: dtype mismatch between input {} ({}) and input {} ({})",
               call.op.name, i, call.inputs[i].dtype, j, call.inputs[j].dtype);
}

void check_ndim(const MetaCall& call, size_t i, int64_t ndim, bool at_least) {
  int64_t have = static_cast<int64_t>(call.inputs[i].shape.size());
  TESSEL_CHECK(at_least ? have >= ndim : have == ndim, "{}: input {} must have {}{} dims, got shape {} (inputs: {})",
               call.op.name, i, at_least ? "at least " : "", ndim, shape_str(call.inputs[i].shape), inputs_str(call));
}

void check_index(const MetaCall& call, size_t i) {
  TESSEL_CHECK(is_integral(call.inputs[i].dtype), "{}: input {} has dtype {}; expected i32 or i64 indices", call.op.name,
               i, call.inputs[i].dtype);
}

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  const Shape& g = grad.shape();
  size_t lead = g.size() - shape.size();
  std::vector<int64_t> dims;
  for (size_t i = 0; i < g.size(); ++i)
    if (i < lead || (shape[i - lead] == 1 && g[i] != 1)) dims.push_back(static_cast<int64_t>(i));
  Tensor s = dims.empty() ? grad : sum(grad, dims, /*keepdim=*/true);
  return reshape(s, shape);
}

DimSplit split_at(const Shape& shape, int64_t dim) {
  DimSplit s;
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
    if (i < dim) s.outer *= shape[i];
    else if (i == dim) s.size = shape[i];
    else s.inner *= shape[i];
  }
  return s;
}

double io_bytes(const MetaCall& call, std::span<const TensorMeta> outputs) {
  double bytes = 0;
  for (const TensorMeta& m : call.inputs) bytes += static_cast<double>(m.nbytes());
  for (const TensorMeta& m : outputs) bytes += static_cast<double>(m.nbytes());
  return bytes;
}

Cost elementwise_cost(const MetaCall& call, std::span<const TensorMeta> outputs, double flops_per_element) {
  double n = outputs.empty() ? 0 : static_cast<double>(outputs[0].numel());
  return Cost{flops_per_element * n, io_bytes(call, outputs)};
}

}  // namespace tessel::kernels
