// The CUDA backend on a GPU: device description, copies through pinned staging, the caching
// allocator's counters, streams and events, and every op that has a CUDA kernel against the
// CPU's (forward at f32 within 1e-5 relative, gradients at f64). Without a GPU every test
// skips and says why; scripts/gpu_check.sh runs them where one is lent.
#include <gtest/gtest.h>

#include <string>

#include "op_cases.h"
#include "tessel/autograd/engine.h"
#include "tessel/core/context.h"
#include "tessel/core/view.h"
#include "tessel/ops/cuda/kernels.h"
#include "tessel/ops/inplace.h"
#include "tessel/optim/optimizer.h"
#include "tessel/ops/registry.h"

namespace tessel::testing {
namespace {

const Device kGpu{DeviceType::cuda, 0};

bool have_gpu() {
  cuda::install();
  return find_device_backend(DeviceType::cuda)->device_count() > 0;
}

#define TESSEL_REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no GPU on this machine (the CUDA backend is built; the driver shows no device)"

TEST(CudaDevice, DescribesItsDevices) {
  TESSEL_REQUIRE_GPU();
  std::string d = device_backend(kGpu).describe(0);
  EXPECT_NE(d.find("sm_"), std::string::npos) << d;
  std::printf("cuda:0 %s\n", d.c_str());
}

TEST(CudaDevice, CopiesRoundTrip) {
  TESSEL_REQUIRE_GPU();
  // 20 MiB of f32: three chunks of the pinned staging buffers each way.
  Tensor h = rand_tensor({5, 1 << 20}, DType::f32, 7);
  Tensor g = h.to(kGpu);
  EXPECT_EQ(g.device(), kGpu);
  EXPECT_EQ(compare(g.to(Device{}), h, 0, 0), "");
  // A strided view, converted on the device, and a fill.
  Tensor t = view::to_dtype(view::transpose(view::slice(g, 1, 0, 6), 0, 1), DType::f64);
  Tensor want = view::to_dtype(view::transpose(view::slice(h, 1, 0, 6), 0, 1), DType::f64);
  EXPECT_EQ(compare(t.to(Device{}), want, 0, 0), "");
  Tensor b = view::to_dtype(g, DType::bf16);
  EXPECT_EQ(compare(b.to(Device{}), view::to_dtype(h, DType::bf16), 0, 0), "");
  view::fill(view::select(g, 0, 2), 4.0);
  EXPECT_EQ(view::select(g, 0, 2).to(Device{}).to_doubles()[12345], 4.0);
}

TEST(CudaDevice, CachingAllocatorCountsAndEmptiesItsCache) {
  TESSEL_REQUIRE_GPU();
  Allocator& a = device_allocator(kGpu);
  a.empty_cache();
  AllocatorStats before = a.stats();
  {
    Tensor t = Tensor::empty({1 << 20}, DType::f32, kGpu);  // 4 MiB: a 20 MiB segment
    EXPECT_EQ(a.stats().allocated - before.allocated, 4 << 20);
    EXPECT_EQ(a.stats().reserved - before.reserved, 20 << 20);
  }
  EXPECT_EQ(a.stats().allocated, before.allocated);
  EXPECT_EQ(a.stats().reserved - before.reserved, 20 << 20);  // cached
  Tensor again = Tensor::empty({1 << 20}, DType::f32, kGpu);
  EXPECT_GT(a.stats().cache_hits, before.cache_hits);
  again = Tensor();
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved, before.reserved);
}

TEST(CudaDevice, StreamsOrderWorkThroughEvents) {
  TESSEL_REQUIRE_GPU();
  DeviceBackend& b = device_backend(kGpu);
  Stream s1{kGpu, b.create_stream(0)}, s2{kGpu, b.create_stream(0)};
  Tensor x = Tensor::zeros({1 << 22}, DType::f32, kGpu);
  Tensor y;
  {
    DeviceScope on(kGpu, s1.id);
    view::fill(x, 2.0);
  }
  Event e(kGpu);
  e.record(s1);
  e.wait(s2);  // s2 waits for the fill, the host does not
  {
    DeviceScope on(kGpu, s2.id);
    y = scale(x, 3.0);
  }
  b.synchronize(s2);
  EXPECT_TRUE(e.done());
  EXPECT_EQ(y.to(Device{}).to_doubles()[777], 6.0);
  b.destroy_stream(s1);
  b.destroy_stream(s2);
}

// The updates no op covers: add_ (broadcast source), scale_ and AdamW, against the CPU's.
TEST(CudaUpdates, MatchTheCpu) {
  TESSEL_REQUIRE_GPU();
  Tensor d = rand_tensor({64, 33}, DType::f32, 1), s = rand_tensor({33}, DType::f32, 2);
  Tensor dg = d.to(kGpu);
  add_(d, s, 0.5);
  add_(dg, s.to(kGpu), 0.5);
  EXPECT_EQ(compare(dg.to(Device{}), d, 1e-6, 1e-7), "");
  scale_(d, -3.0);
  scale_(dg, -3.0);
  EXPECT_EQ(compare(dg.to(Device{}), d, 1e-6, 1e-7), "");

  Tensor p = rand_tensor({1000}, DType::f32, 3), g = rand_tensor({1000}, DType::f32, 4);
  Tensor m = Tensor::zeros({1000}, DType::f32), v = Tensor::zeros({1000}, DType::f32);
  Tensor pg = p.to(kGpu), gg = g.to(kGpu), mg = m.to(kGpu), vg = v.to(kGpu);
  optim::AdamWOptions o;
  for (int64_t step = 1; step <= 3; ++step) {
    optim::adamw_update(p, g, m, v, step, o, 1e-2, true, 0.5f);
    optim::adamw_update(pg, gg, mg, vg, step, o, 1e-2, true, 0.5f);
  }
  EXPECT_EQ(compare(pg.to(Device{}), p, 1e-5, 1e-7), "");
  EXPECT_EQ(compare(vg.to(Device{}), v, 1e-5, 1e-9), "");
}

const std::vector<OpCase>& cases() {
  static const std::vector<OpCase> all = all_cases();
  return all;
}

class CudaOpCase : public ::testing::TestWithParam<size_t> {
 protected:
  const OpCase& c() const { return cases()[GetParam()]; }
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no GPU on this machine";
    if (!supports_op(op_by_name(c().op), kGpu)) GTEST_SKIP() << c().op << " has no CUDA kernel yet";
  }
};

// Skips (naming what is missing) when the case needs a kernel the GPU does not have yet.
#define TESSEL_ON_GPU(stmt)                                                                \
  try {                                                                                    \
    stmt;                                                                                  \
  } catch (const Error& e) {                                                               \
    if (std::string(e.what()).find("no kernel for device cuda") != std::string::npos ||    \
        std::string(e.what()).find("no backward kernel for device cuda") != std::string::npos) \
      GTEST_SKIP() << e.what();                                                            \
    throw;                                                                                 \
  }

TEST_P(CudaOpCase, ForwardMatchesTheCpuAtF32) {
  Tensors in = c().make_inputs(DType::f32);
  Tensors want = c().run(in);
  Tensors got;
  TESSEL_ON_GPU({
    DeviceScope scope(kGpu);
    got = c().run(to_device(in, kGpu));
  });
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].device(), kGpu) << "output " << i;
    EXPECT_EQ(compare(got[i].to(Device{}), want[i], 1e-5, 1e-6), "") << "output " << i;
  }
}

TEST_P(CudaOpCase, GradientsMatchTheCpuAtF64) {
  if (!c().grad) GTEST_SKIP() << "not differentiable";
  Tensors in = c().make_inputs(DType::f64);
  Tensors want = case_gradients(c(), Device{}, in);
  Tensors got;
  TESSEL_ON_GPU(got = case_gradients(c(), kGpu, in));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (!want[i].defined()) continue;
    EXPECT_EQ(compare(got[i].to(Device{}), want[i], 1e-10, 1e-12), "") << "gradient " << i;
  }
}

std::string case_name(const ::testing::TestParamInfo<size_t>& info) {
  std::string n = cases()[info.param].name;
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaOpCase, ::testing::Range<size_t>(0, cases().size()), case_name);

// Not a check: which ops have CUDA kernels, printed for gpu_check.sh's record.
TEST(CudaOps, Coverage) {
  cuda::install();
  std::string with, without;
  int n = 0;
  for (const OpDef* op : all_ops()) {
    bool k = find_kernel(*op, DeviceType::cuda) != nullptr;
    n += k;
    (k ? with : without) += fmt::format(" {}", op->name);
  }
  std::printf("CUDA kernels: %d of %zu ops\n  with:%s\n  without:%s\n", n, all_ops().size(), with.c_str(),
              without.c_str());
  EXPECT_GT(n, 0);
}

}  // namespace
}  // namespace tessel::testing
