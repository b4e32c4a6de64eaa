// Collectives on device memory through CommBuffers: tensors on the guarded device (which the
// thread backend cannot read) are staged through host copies and written back when the Work is
// waited on — with wait() or wait_on(stream); host tensors pass through untouched.
#include <gtest/gtest.h>

#include "tessel/comm/thread_backend.h"
#include "tessel/comm/world.h"
#include "tessel/core/context.h"
#include "tessel/core/guarded_device.h"
#include "tessel/dist/comm_buffers.h"

namespace tessel {
namespace {

TEST(CommBuffers, AllReduceAndAllGatherOnTheGuardedDevice) {
  spawn(2, [](int rank) {
    const Device dev{DeviceType::guarded, rank};
    Tensor x = Tensor::full({5}, 1.0 + rank, DType::f32, dev);
    CommBuffers b;
    WorkPtr w = b.finish(world_group()->all_reduce_async(b.inout(x), 5, DType::f32, ReduceOp::sum));
    w->wait_on(Stream{dev, 0});
    EXPECT_EQ(x.device(), dev);
    EXPECT_EQ(x.to_doubles(), std::vector<double>(5, 3.0));

    Tensor mine = Tensor::full({2}, 10.0 * (rank + 1), DType::f32, dev), all = Tensor::empty({4}, DType::f32, dev);
    CommBuffers g;
    g.finish(world_group()->all_gather_async(g.in(mine), g.out(all), 2, DType::f32))->wait();
    EXPECT_EQ(all.to_doubles(), (std::vector<double>{10, 10, 20, 20}));
    EXPECT_FALSE(guarded_memory_open());
  });
}

TEST(CommBuffers, HostTensorsPassThrough) {
  spawn(2, [](int rank) {
    Tensor x = Tensor::full({3}, 1.0 + rank, DType::f64);
    CommBuffers b;
    void* p = b.inout(x);
    EXPECT_EQ(p, x.raw_data());  // no copy
    WorkPtr inner = world_group()->all_reduce_async(p, 3, DType::f64, ReduceOp::max);
    WorkPtr w = b.finish(inner);
    EXPECT_EQ(w, inner);  // nothing staged: the collective's own Work
    w->wait();
    EXPECT_EQ(x.to_doubles(), std::vector<double>(3, 2.0));
  });
}

}  // namespace
}  // namespace tessel
