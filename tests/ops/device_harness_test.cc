// Every op on the guarded test device against the CPU device, bit for bit: the forward (f64
// and f32, contiguous and not) and the gradients of every differentiable case. The guarded
// device runs the CPU's kernels on memory the host may touch only inside them, so an op whose
// code reads device memory outside its kernel, or makes an output on the wrong device, fails
// here (or dies) in CI instead of on a GPU. Then: an op given tensors on two devices, or a
// device it has no kernel for, fails naming the op, the tensors and their devices.
#include <gtest/gtest.h>

#include <cstring>

#include "op_cases.h"
#include "tessel/autograd/engine.h"
#include "tessel/core/context.h"
#include "tessel/core/guarded_device.h"
#include "tessel/ops/registry.h"

namespace tessel::testing {
namespace {

const Device kGuarded{DeviceType::guarded, 0};

const std::vector<OpCase>& cases() {
  static const std::vector<OpCase> all = all_cases();
  return all;
}

// Empty when `got` (on any device) has the dtype, shape and bits of `want`.
std::string bitwise(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape())
    return fmt::format("{} against {}", got.meta().str(), want.meta().str());
  std::vector<double> a = got.to_doubles(), b = want.to_doubles();
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(double)) != 0)
      return fmt::format("element {}: {} on {} against {} on cpu", i, a[i], got.device().str(), b[i]);
  return "";
}

class DeviceCaseTest : public ::testing::TestWithParam<size_t> {
 protected:
  const OpCase& c() const { return cases()[GetParam()]; }

  // The case's outputs from `in` run on `device`.
  Tensors run_on(Device device, const Tensors& in) const {
    DeviceScope scope(device);
    return c().run(to_device(in, device));
  }
};

TEST_P(DeviceCaseTest, ForwardOnTheGuardedDeviceIsBitwiseTheCpus) {
  for (DType dtype : {DType::f64, DType::f32}) {
    for (bool contiguous : {true, false}) {
      if (!contiguous && !c().noncontig) continue;
      Tensors in = c().make_inputs(dtype);
      if (!contiguous)
        for (Tensor& t : in) t = noncontiguous(t);
      Tensors want = c().run(in);
      Tensors got = run_on(kGuarded, in);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].device(), kGuarded) << "output " << i;
        EXPECT_EQ(bitwise(got[i], want[i]), "") << dtype_name(dtype) << (contiguous ? "" : " non-contiguous")
                                                << ", output " << i;
      }
    }
  }
  EXPECT_FALSE(guarded_memory_open());
}

TEST_P(DeviceCaseTest, GradientsOnTheGuardedDeviceAreBitwiseTheCpus) {
  if (!c().grad) GTEST_SKIP() << "not differentiable";
  Tensors in = c().make_inputs(DType::f64);
  Tensors want = case_gradients(c(), Device{}, in);
  Tensors got = case_gradients(c(), kGuarded, in);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].defined(), want[i].defined()) << "gradient " << i;
    if (!got[i].defined()) continue;
    EXPECT_EQ(got[i].device(), kGuarded) << "gradient " << i;
    EXPECT_EQ(bitwise(got[i], want[i]), "") << "gradient " << i;
  }
  EXPECT_FALSE(guarded_memory_open());
}

std::string case_name(const ::testing::TestParamInfo<size_t>& info) {
  std::string n = cases()[info.param].name;
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Guarded, DeviceCaseTest, ::testing::Range<size_t>(0, cases().size()), case_name);

TEST(DeviceDispatch, InputsOnTwoDevicesNameTheOpTensorsAndDevices) {
  Tensor a = Tensor::ones({2, 3}).set_name("a");
  Tensor b = Tensor::ones({2, 3}, DType::f32, kGuarded).set_name("b");
  try {
    add(a, b);
    FAIL() << "add ran on two devices";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const char* s : {"add", "'a'", "'b'", "on cpu", "on guarded:0"})
      EXPECT_NE(msg.find(s), std::string::npos) << "'" << msg << "' lacks '" << s << "'";
  }
}

TEST(DeviceDispatch, EveryOpRunsOnTheGuardedDevice) {
  for (const OpDef* op : all_ops()) {
    EXPECT_TRUE(supports_op(*op, kGuarded)) << op->name;
    EXPECT_EQ(kernel_types(*op).substr(0, 3), "cpu") << op->name;
  }
}

TEST(DeviceDispatch, ADeviceWithoutAKernelIsANamedError) {
  if (find_device_backend(DeviceType::cuda) == nullptr) GTEST_SKIP() << "no CUDA backend in this build";
  if (find_device_backend(DeviceType::cuda)->device_count() == 0) GTEST_SKIP() << "no GPU";
  // An op is found without a CUDA kernel only while the backend is incomplete; nothing to test
  // once every op has one.
  for (const OpDef* op : all_ops())
    if (!supports_op(*op, Device{DeviceType::cuda, 0})) {
      Tensor x = Tensor::ones({2}, DType::f32, Device{DeviceType::cuda, 0});
      EXPECT_THROW(call_op(*op, {x}), Error) << op->name;
      return;
    }
}

}  // namespace
}  // namespace tessel::testing
