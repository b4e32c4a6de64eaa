// Concatenates the per-family tables.
#include "op_cases.h"

#include "tessel/autograd/engine.h"
#include "tessel/core/context.h"

namespace tessel::testing {

std::vector<OpCase> all_cases() {
  std::vector<OpCase> all;
#define TESSEL_APPEND(f)                       \
  for (OpCase& c : f##_cases()) all.push_back(std::move(c));
  TESSEL_OP_FAMILIES(TESSEL_APPEND)
#undef TESSEL_APPEND
  return all;
}

std::vector<ErrorCase> error_cases() {
  std::vector<ErrorCase> all;
#define TESSEL_APPEND(f)                          \
  for (ErrorCase& c : f##_errors()) all.push_back(std::move(c));
  TESSEL_OP_FAMILIES(TESSEL_APPEND)
#undef TESSEL_APPEND
  return all;
}

Tensors to_device(const Tensors& in, Device device) {
  Tensors out;
  for (const Tensor& t : in) out.push_back(t.defined() ? t.to(device) : t);
  return out;
}

Tensors case_gradients(const OpCase& c, Device device, Tensors in) {
  DeviceScope scope(device);
  in = to_device(in, device);
  Tensors targets;
  for (Tensor& t : in)
    if (t.dtype() == DType::f64) {
      t = t.detach();
      t.set_requires_grad(true);
      targets.push_back(t);
    }
  Tensors outs = c.run(in);
  Tensor loss;
  for (size_t k = 0; k < outs.size(); ++k) {
    if (!is_floating(outs[k].dtype()) || !outs[k].requires_grad()) continue;
    Tensor term = sum(mul(outs[k], rand_tensor(outs[k].shape(), DType::f64, 1000 + k).to(device)));
    loss = loss.defined() ? add(loss, term) : term;
  }
  if (!loss.defined()) return {};
  return grad({loss}, targets);
}

}  // namespace tessel::testing
