// Devices: text forms, the stream-ordered caching allocator, the guarded test device (its
// memory unreadable outside kernel scopes), Tensor::to and factories on the current device.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <set>

#include "tessel/core/caching_allocator.h"
#include "tessel/core/context.h"
#include "tessel/core/guarded_device.h"
#include "tessel/core/tensor.h"
#include "tessel/core/view.h"

namespace tessel {
namespace {

const Device kGuarded{DeviceType::guarded, 0};

TEST(Device, TextFormsRoundTrip) {
  for (const char* text : {"cpu", "cuda:0", "cuda:3", "guarded:0", "guarded:7"})
    EXPECT_EQ(Device::parse(text).str(), text);
  EXPECT_EQ(Device::parse("cuda"), (Device{DeviceType::cuda, 0}));
  EXPECT_EQ(Device::parse("guarded"), kGuarded);
}

TEST(Device, BadTextNamesIt) {
  for (const char* text : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cpu:0", "cudax"}) {
    try {
      Device::parse(text);
      FAIL() << text << " parsed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + text + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(Device, UnavailableDeviceIsANamedError) {
  if (find_device_backend(DeviceType::cuda) != nullptr) GTEST_SKIP() << "this build has a CUDA backend";
  try {
    Tensor::empty({4}, DType::f32, Device{DeviceType::cuda, 0});
    FAIL() << "allocated on cuda:0";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tensor::empty({4}, DType::f32, Device{DeviceType::guarded, kGuardedDevices}), Error);
}

// Segments from the host heap, counted, so the allocator's policy can be checked.
class HeapSegments final : public SegmentSource {
 public:
  explicit HeapSegments(size_t limit, std::set<void*>* live) : limit_(limit), live_(live) {}
  void* allocate_segment(size_t nbytes) override {
    if (used_ + nbytes > limit_) return nullptr;
    used_ += nbytes;
    void* p = std::aligned_alloc(512, nbytes);
    live_->insert(p);
    return p;
  }
  void free_segment(void* ptr, size_t nbytes) override {
    used_ -= nbytes;
    live_->erase(ptr);
    std::free(ptr);
  }
  std::string device_name() const override { return "test:0"; }

 private:
  size_t limit_, used_ = 0;
  std::set<void*>* live_;
};

TEST(CachingAllocator, SplitsASegmentAndReusesFreedBlocksOnTheSameStream) {
  std::set<void*> live;
  CachingAllocator a(std::make_unique<HeapSegments>(size_t{1} << 30, &live));
  void* p = a.allocate(1000, 0);  // 1024 bytes of a 2 MiB small segment
  void* q = a.allocate(3000, 0);  // 3072 bytes split off the rest of it
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.segments, 1);
  EXPECT_EQ(s.reserved, int64_t{2} << 20);
  EXPECT_EQ(s.allocated, 1024 + 3072);
  EXPECT_EQ(static_cast<char*>(q) - static_cast<char*>(p), 1024);
  EXPECT_GE(s.splits, 2);
  a.deallocate(p, 1000, 0);
  void* r = a.allocate(900, 0);  // the freed 1024 bytes again
  EXPECT_EQ(r, p);
  EXPECT_EQ(a.stats().cache_hits, 2);
  a.deallocate(r, 900, 0);
  a.deallocate(q, 3000, 0);
  EXPECT_EQ(a.stats().allocated, 0);
  EXPECT_EQ(a.stats().allocated_peak, 1024 + 3072);
  a.empty_cache();  // the segment merged back whole, so it is given back
  EXPECT_EQ(a.stats().segments, 0);
  EXPECT_EQ(a.stats().reserved, 0);
  EXPECT_TRUE(live.empty());
}

TEST(CachingAllocator, StreamsHaveTheirOwnPools) {
  std::set<void*> live;
  CachingAllocator a(std::make_unique<HeapSegments>(size_t{1} << 30, &live));
  void* p = a.allocate(4096, 1);
  a.deallocate(p, 4096, 1);
  void* q = a.allocate(4096, 2);  // stream 2 may not take stream 1's block
  EXPECT_EQ(a.stats().segments, 2);
  void* r = a.allocate(4096, 1);
  EXPECT_EQ(r, p);
  a.deallocate(q, 4096, 2);
  a.deallocate(r, 4096, 1);
}

TEST(CachingAllocator, SizeClasses) {
  EXPECT_EQ(CachingAllocator::block_size(1), 512u);
  EXPECT_EQ(CachingAllocator::block_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::segment_size(1 << 20), size_t{2} << 20);
  EXPECT_EQ(CachingAllocator::segment_size((1 << 20) + 512), size_t{20} << 20);
  EXPECT_EQ(CachingAllocator::segment_size((size_t{10} << 20) + 512), size_t{12} << 20);
}

TEST(CachingAllocator, LargeBlocksSplitOnlyWhenTheRestIsWorthKeeping) {
  std::set<void*> live;
  CachingAllocator a(std::make_unique<HeapSegments>(size_t{1} << 30, &live));
  void* p = a.allocate(size_t{3} << 20, 0);  // 3 MiB of a 20 MiB segment: 17 MiB kept apart
  void* q = a.allocate(size_t{3} << 20, 0);  // from that rest
  EXPECT_EQ(a.stats().segments, 1);
  a.deallocate(p, 0, 0);
  a.deallocate(q, 0, 0);
  void* big = a.allocate(size_t{19} << 20, 0);  // merged back into one 20 MiB block: reused, no split
  EXPECT_EQ(a.stats().segments, 1);
  EXPECT_EQ(a.stats().allocated, int64_t{20} << 20);
  a.deallocate(big, 0, 0);
}

TEST(CachingAllocator, OutOfMemoryFreesTheCacheThenNamesTheDevice) {
  std::set<void*> live;
  CachingAllocator a(std::make_unique<HeapSegments>(size_t{24} << 20, &live));
  void* p = a.allocate(size_t{4} << 20, 0);  // a 20 MiB segment
  a.deallocate(p, 0, 0);
  void* q = a.allocate(size_t{12} << 20, 0);  // needs 12 MiB more than the limit allows: the cache goes first
  EXPECT_EQ(a.stats().segments, 1);
  try {
    a.allocate(size_t{16} << 20, 0);
    FAIL() << "allocated past the limit";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory on test:0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("16777216"), std::string::npos) << msg;
  }
  a.deallocate(q, 0, 0);
}

TEST(GuardedDevice, ValuesRoundTripThroughIt) {
  Tensor h = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor g = h.to(kGuarded);
  EXPECT_EQ(g.device(), kGuarded);
  EXPECT_FALSE(guarded_memory_open());
  EXPECT_EQ(g.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  // A strided view converted across devices.
  Tensor t = view::transpose(g, 0, 1);
  Tensor back = Tensor::empty({3, 2}, DType::f64, Device{});
  view::copy(back, t);
  EXPECT_EQ(back.to_doubles(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
  view::fill(view::select(g, 0, 1), 9);
  EXPECT_EQ(g.to_doubles(), (std::vector<double>{1, 2, 3, 9, 9, 9}));
  EXPECT_EQ(g.to(Device{DeviceType::guarded, 1}).to_doubles(), g.to_doubles());
  EXPECT_FALSE(guarded_memory_open());
}

TEST(GuardedDevice, FactoriesUseTheCurrentDevice) {
  DeviceScope scope(kGuarded);
  EXPECT_EQ(Tensor::zeros({3}).device(), kGuarded);
  Tensor v = Tensor::from_vector<int64_t>({4, 5, 6}, {3});
  EXPECT_EQ(v.device(), kGuarded);
  EXPECT_EQ(v.to_vector<int64_t>(), (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(Tensor::arange(3, DType::f32).to_doubles(), (std::vector<double>{0, 1, 2}));
  EXPECT_DOUBLE_EQ(Tensor::scalar(2.5).item(), 2.5);
  EXPECT_EQ(Tensor::zeros({2}, DType::f32, Device{}).device(), Device{});
}

TEST(GuardedDevice, AllocatorCountsItsBytes) {
  Allocator& a = device_allocator(Device{DeviceType::guarded, 2});
  int64_t before = a.stats().allocated;
  {
    Tensor t = Tensor::empty({1000}, DType::f32, Device{DeviceType::guarded, 2});
    EXPECT_EQ(a.stats().allocated - before, 4096);  // 4000 bytes in 512-byte steps
  }
  EXPECT_EQ(a.stats().allocated, before);
}

TEST(GuardedDevice, KernelScopeOpensItsMemory) {
  Tensor g = Tensor::full({4}, 3.0, DType::f32, kGuarded);
  float v = 0;
  {
    KernelScope scope(kGuarded);
    EXPECT_TRUE(guarded_memory_open());
    v = g.data<float>()[2];
  }
  EXPECT_EQ(v, 3.0f);
  EXPECT_FALSE(guarded_memory_open());
}

// The point of the device: host code that reads device memory as host memory dies at the read.
TEST(GuardedDeviceDeathTest, AHostReadOutsideAKernelCrashes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Tensor g = Tensor::full({4}, 3.0, DType::f32, kGuarded);
#if defined(__SANITIZE_ADDRESS__)  // AddressSanitizer reports the fault and exits
  auto segv = [](int status) { return WIFEXITED(status) && WEXITSTATUS(status) != 0; };
  const char* says = "SEGV";
#else
  auto segv = ::testing::KilledBySignal(SIGSEGV);
  const char* says = "";
#endif
  EXPECT_EXIT(
      {
        volatile float x = g.data<float>()[0];
        (void)x;
      },
      segv, says);
  EXPECT_EXIT({ g.data<float>()[1] = 1.0f; }, segv, says);
}

}  // namespace
}  // namespace tessel
