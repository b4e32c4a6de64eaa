// The op conformance harness: every registered op, forward and backward, against references
// and finite differences, with non-contiguous, bf16 and edge-case inputs.
#include <gtest/gtest.h>

#include <set>

#include "op_cases.h"
#include "tessel/autograd/engine.h"
#include "tessel/core/context.h"
#include "tessel/core/view.h"
#include "tessel/ops/dispatch.h"
#include "tessel/ops/ops.h"
#include "tessel/ops/registry.h"

namespace tessel::testing {
namespace {

const std::vector<OpCase>& cases() {
  static const std::vector<OpCase> all = all_cases();
  return all;
}

Tensors cast_floating(const Tensors& in, DType dtype) {
  Tensors out;
  for (const Tensor& t : in) out.push_back(is_floating(t.dtype()) ? view::to_dtype(t, dtype) : t);
  return out;
}

TEST(OpHarness, EveryRegisteredOpHasACase) {
  std::set<std::string> covered;
  std::set<std::string> names;
  for (const OpCase& c : cases()) {
    covered.insert(c.op);
    EXPECT_TRUE(names.insert(c.name).second) << "duplicate case name " << c.name;
    EXPECT_NE(find_op(c.op), nullptr) << "case " << c.name << " names unknown op " << c.op;
  }
  std::vector<std::string> missing;
  for (const OpDef* op : all_ops())
    if (!covered.count(std::string(op->name))) missing.push_back(std::string(op->name));
  EXPECT_TRUE(missing.empty()) << "ops without a test case: " << fmt::format("{}", fmt::join(missing, ", "));
}

TEST(OpHarness, EveryDifferentiableOpHasAGradientCase) {
  std::set<std::string> checked;
  for (const OpCase& c : cases()) {
    if (c.grad) checked.insert(c.op);
  }
  for (const OpDef* op : all_ops()) {
    if (op->backward != nullptr) {
      EXPECT_TRUE(checked.count(std::string(op->name))) << op->name << " has a backward but no gradient-checked case";
    }
  }
}

// Every attribute any case passes — forward, backward and the ops those call — is declared in
// its op's OpDef::attrs, and every signature parses: the Python front end builds each op's
// signature and defaults from them.
TEST(OpHarness, EveryAttributePassedIsDeclared) {
  for (const OpDef* op : all_ops()) EXPECT_NO_THROW(op_attr_specs(*op)) << op->name;
  attr_declaration_check() = true;
  for (const OpCase& c : cases()) {
    SCOPED_TRACE(c.name);
    try {
      Tensors in = c.make_inputs(DType::f64);
      Tensors leaves;
      for (Tensor& t : in)
        if (t.defined() && is_floating(t.dtype()) && c.grad) leaves.push_back(t.set_requires_grad(true));
      Tensors out = c.run(in);
      Tensor loss;
      for (const Tensor& o : out)
        if (o.defined() && o.requires_grad()) loss = loss.defined() ? add(loss, sum(o)) : sum(o);
      if (loss.defined()) backward(loss);
    } catch (const InternalError& e) {
      ADD_FAILURE() << e.what();
    }
  }
  attr_declaration_check() = false;
}

class OpCaseTest : public ::testing::TestWithParam<size_t> {
 protected:
  const OpCase& c() const { return cases()[GetParam()]; }
};

TEST_P(OpCaseTest, ForwardF64MatchesReference) {
  Tensors in = c().make_inputs(DType::f64);
  Tensors got = c().run(in);
  Tensors want = c().reference(in);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].shape(), want[i].shape()) << "output " << i;
    EXPECT_EQ(compare(got[i], want[i], 1e-10, 1e-12), "") << "output " << i;
  }
}

TEST_P(OpCaseTest, ForwardF32MatchesReference) {
  Tensors in = c().make_inputs(DType::f32);
  Tensors got = c().run(in);
  Tensors want = c().reference(cast_floating(in, DType::f64));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (c().keeps_dtype && is_floating(want[i].dtype())) {
      EXPECT_EQ(got[i].dtype(), DType::f32) << "output " << i;
    }
    EXPECT_EQ(compare(got[i], want[i], c().f32_rtol, c().f32_atol), "") << "output " << i;
  }
}

TEST_P(OpCaseTest, NonContiguousInputsGiveTheSameResult) {
  if (!c().noncontig) GTEST_SKIP() << "case opts out";
  Tensors in = c().make_inputs(DType::f64);
  Tensors nc;
  for (const Tensor& t : in) nc.push_back(noncontiguous(t));
  Tensors a = c().run(in), b = c().run(nc);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(compare(b[i], a[i], 1e-12, 1e-13), "") << "output " << i;
}

TEST_P(OpCaseTest, Bf16RoundTrip) {
  if (!c().bf16) GTEST_SKIP() << "case opts out";
  Tensors in = c().make_inputs(DType::bf16);
  bool any_bf16 = false;
  for (const Tensor& t : in) any_bf16 = any_bf16 || t.dtype() == DType::bf16;
  if (!any_bf16) GTEST_SKIP() << "no floating inputs";
  Tensors got = c().run(in);
  Tensors want = c().reference(cast_floating(in, DType::f64));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (c().keeps_dtype && is_floating(want[i].dtype())) {
      EXPECT_EQ(got[i].dtype(), DType::bf16) << "output " << i;
    }
    EXPECT_EQ(compare(got[i], want[i], 2e-2, 2e-2), "") << "output " << i;
  }
}

// L = Σ_k Σ out_k · w_k with fixed random w_k; autograd's dL/dx against central differences.
TEST_P(OpCaseTest, GradientMatchesFiniteDifferences) {
  if (!c().grad) GTEST_SKIP() << "not differentiable";
  Tensors in = c().make_inputs(DType::f64);
  std::vector<size_t> wrt;
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].dtype() == DType::f64) {
      in[i] = view::clone(in[i]);
      in[i].set_requires_grad(true);
      wrt.push_back(i);
    }
  ASSERT_FALSE(wrt.empty());
  Tensors outs = c().run(in);
  Tensors weights;
  for (size_t k = 0; k < outs.size(); ++k)
    weights.push_back(is_floating(outs[k].dtype()) ? rand_tensor(outs[k].shape(), DType::f64, 1000 + k) : Tensor());
  auto loss_value = [&](const Tensors& o) {
    double l = 0;
    for (size_t k = 0; k < o.size(); ++k) {
      if (!weights[k].defined()) continue;
      std::vector<double> a = o[k].to_doubles(), w = weights[k].to_doubles();
      for (size_t j = 0; j < a.size(); ++j) l += a[j] * w[j];
    }
    return l;
  };
  Tensor loss;
  for (size_t k = 0; k < outs.size(); ++k) {
    if (!weights[k].defined() || !outs[k].requires_grad()) continue;
    Tensor term = sum(mul(outs[k], weights[k]));
    loss = loss.defined() ? add(loss, term) : term;
  }
  ASSERT_TRUE(loss.defined()) << "no differentiable output";
  Tensors targets;
  for (size_t i : wrt) targets.push_back(in[i]);
  Tensors grads = grad({loss}, targets);

  NoGradGuard no_grad;
  const double eps = 1e-6;
  for (size_t w = 0; w < wrt.size(); ++w) {
    Tensor& x = in[wrt[w]];
    double* p = x.data<double>();
    std::vector<double> numeric(static_cast<size_t>(x.numel()));
    for (int64_t j = 0; j < x.numel(); ++j) {
      double saved = p[j];
      p[j] = saved + eps;
      double up = loss_value(c().run(in));
      p[j] = saved - eps;
      double down = loss_value(c().run(in));
      p[j] = saved;
      numeric[static_cast<size_t>(j)] = (up - down) / (2 * eps);
    }
    Tensor expect = Tensor::from_doubles(numeric, x.shape(), DType::f64);
    Tensor got = grads[w].defined() ? grads[w] : Tensor::zeros(x.shape(), DType::f64);
    EXPECT_EQ(compare(got, expect, 1e-5, 1e-6), "") << "gradient of input " << wrt[w];
  }
}

std::string case_name(const ::testing::TestParamInfo<size_t>& info) {
  std::string n = cases()[info.param].name;
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Ops, OpCaseTest, ::testing::Range<size_t>(0, cases().size()), case_name);

class OpErrorTest : public ::testing::TestWithParam<size_t> {};

TEST_P(OpErrorTest, BadInputThrowsANamedError) {
  static const std::vector<ErrorCase> all = error_cases();
  const ErrorCase& e = all[GetParam()];
  try {
    e.call();
    FAIL() << e.name << ": no error thrown";
  } catch (const Error& err) {
    std::string msg = err.what();
    for (const std::string& s : e.expect) EXPECT_NE(msg.find(s), std::string::npos) << "message '" << msg << "' lacks '" << s << "'";
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, OpErrorTest, ::testing::Range<size_t>(0, error_cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           std::string n = error_cases()[info.param].name;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace tessel::testing
