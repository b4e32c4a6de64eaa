// Tensors handed to a collective. The thread and Gloo backends move host bytes; a tensor on a
// device the host cannot read (a GPU under Gloo, the guarded test device) is staged through a
// host copy: copied in before the collective is issued, copied back when its Work is waited
// on. Host tensors (and tensors made while tracing) pass through as they are. Tensors must be
// contiguous: collectives see bytes.
//
//   CommBuffers b;
//   WorkPtr w = b.finish(group->all_reduce_async(b.inout(flat), n, DType::f32, ReduceOp::sum));
//   w->wait();  // flat holds the sum, wherever it lives
#pragma once

#include <vector>

#include "tessel/comm/process_group.h"
#include "tessel/core/tensor.h"

namespace tessel {

class CommBuffers {
 public:
  const void* in(const Tensor& t);  // read by the collective
  void* out(const Tensor& t);       // written by it
  void* inout(const Tensor& t);     // both
  // `work`, or (when something was staged) a Work whose wait() also copies the outputs back.
  // Call it once, after the collective is issued.
  WorkPtr finish(WorkPtr work);

 private:
  void* stage(const Tensor& t, bool copy_in, bool copy_back);
  struct Staged {
    Tensor device, host;
    bool copy_back = false;
  };
  std::vector<Staged> staged_;
};

}  // namespace tessel
