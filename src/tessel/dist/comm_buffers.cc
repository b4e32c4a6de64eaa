// Host staging of device tensors for collectives (comm_buffers.h).
#include "tessel/dist/comm_buffers.h"

#include <mutex>

#include "tessel/core/error.h"
#include "tessel/core/view.h"

namespace tessel {

namespace {

// The collective's Work, then the copies of its outputs back to their devices, once. It holds
// the host copies of the inputs too, until it is dropped.
class StagedWork final : public Work {
 public:
  struct Pair {
    Tensor device, host;
    bool copy_back = false;
  };
  StagedWork(WorkPtr inner, std::vector<Pair> pairs) : inner_(std::move(inner)), pairs_(std::move(pairs)) {}
  void wait() override {
    inner_->wait();
    std::lock_guard lock(mutex_);
    if (copied_) return;
    for (const Pair& p : pairs_)
      if (p.copy_back) view::copy(p.device, p.host);
    copied_ = true;
  }
  bool is_completed() override { return inner_->is_completed(); }

 private:
  WorkPtr inner_;
  std::mutex mutex_;
  std::vector<Pair> pairs_;
  bool copied_ = false;
};

}  // namespace

void* CommBuffers::stage(const Tensor& t, bool copy_in, bool copy_back) {
  if (t.is_meta() || host_accessible(t.device())) return t.raw_data();
  TESSEL_CHECK(t.is_contiguous(), "collective on {} ({}): the buffer must be contiguous", t.str(), t.device().str());
  Tensor host = copy_in ? t.to(Device{}) : Tensor::empty(t.shape(), t.dtype(), Device{});
  staged_.push_back({t, host, copy_back});
  return host.raw_data();
}

const void* CommBuffers::in(const Tensor& t) { return stage(t, true, false); }
void* CommBuffers::out(const Tensor& t) { return stage(t, false, true); }
void* CommBuffers::inout(const Tensor& t) { return stage(t, true, true); }

WorkPtr CommBuffers::finish(WorkPtr work) {
  if (staged_.empty()) return work;
  std::vector<StagedWork::Pair> pairs;
  for (Staged& s : staged_) pairs.push_back({s.device, s.host, s.copy_back});
  staged_.clear();
  return std::make_shared<StagedWork>(std::move(work), std::move(pairs));
}

}  // namespace tessel
