// The op test table. Every registered op needs at least one case (op_harness_test.cc fails
// naming any op without one). A case builds its inputs, runs the op through its public
// function, and gives a straightforward reference over doubles; the harness then checks
// forward (f64 and f32), gradients against central finite differences (f64), non-contiguous
// inputs and bf16 round trips.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "op_test_util.h"
#include "tessel/ops/ops.h"

namespace tessel::testing {

using Tensors = std::vector<Tensor>;

struct OpCase {
  std::string name;  // unique, "<op>/<variant>"
  std::string op;    // the registry op it covers
  // Inputs with floating ones in `dtype` (index and mask inputs keep their own dtype).
  std::function<Tensors(DType dtype)> make_inputs;
  // Runs the op through its public function.
  std::function<Tensors(const Tensors& inputs)> run;
  // Expected outputs from f64 inputs, computed with plain loops.
  std::function<Tensors(const Tensors& inputs)> reference;
  bool grad = true;       // finite-difference gradient check (f64)
  bool noncontig = true;  // same result with non-contiguous inputs
  bool bf16 = true;       // bf16 inputs give the reference within bf16 precision
  bool keeps_dtype = true;  // floating outputs have the floating inputs' dtype
  double f32_rtol = 2e-5, f32_atol = 2e-6;
};

std::vector<OpCase> all_cases();

// The tensors of `in` (undefined ones kept) on `device`.
Tensors to_device(const Tensors& in, Device device);
// The gradients, with respect to its f64 inputs, of L = Σ_k Σ out_k · w_k (w_k fixed random)
// for case `c` run on `device` with inputs `in`; empty when no output is differentiable. The
// device harnesses compare these across devices.
Tensors case_gradients(const OpCase& c, Device device, Tensors in);

// Bad-input cases: calling `call` must throw tessel::Error whose message contains every
// string of `expect` (the op name and the offending shapes or dtypes).
struct ErrorCase {
  std::string name;
  std::function<void()> call;
  std::vector<std::string> expect;
};
std::vector<ErrorCase> error_cases();

// One table of cases and one of error cases per op family (cases_<family>.cc).
#define TESSEL_OP_FAMILIES(X) \
  X(elementwise) X(matmul) X(reduce) X(shape) X(select) X(index) X(random) X(softmax) X(norm) X(attention)
#define TESSEL_DECLARE_FAMILY(f)      \
  std::vector<OpCase> f##_cases();    \
  std::vector<ErrorCase> f##_errors();
TESSEL_OP_FAMILIES(TESSEL_DECLARE_FAMILY)
#undef TESSEL_DECLARE_FAMILY

}  // namespace tessel::testing

// Builds a `run` from an expression over `in` giving one tensor.
#define TESSEL_RUN1(expr) [](const ::tessel::testing::Tensors& in) { return ::tessel::testing::Tensors{expr}; }
