// ZeRO stage 3's parameter gathers, one unit at a time (a unit is what one call of the model
// uses: the embedding, a transformer block, the head), as PyTorch FSDP2 does with a module's
// parameter group:
//   - just before a unit's forward its parameters are gathered over dp (Shard(d) -> Replicate)
//     into buffers of their own, and the next unit's gather is launched asynchronously (prefetch);
//   - right after the forward the buffers are freed, although the ops that ran keep views of them
//     for their backward;
//   - when the backward reaches the unit's output the buffers are gathered again (waiting for a
//     prefetch if one was launched) and the gather of the unit before it is launched;
//   - each buffer is freed again as soon as its gradient has gone through the gather's backward,
//     i.e. after every op that reads it has had its backward; the gradient goes to the sharded
//     optimizer's buckets (set_grad_sink), which reduce-scatter it onto the shards
//     asynchronously while the backward goes on, or else is resharded onto the shard at once.
// So at most two units' gathered parameters are alive at once, plus those of a unit whose
// backward is under way. A parameter whose dp shard lies inside a dim tp also splits (a 1-D
// column-parallel bias) is gathered by its ordinary reshard instead.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "tessel/comm/process_group.h"
#include "tessel/nn/module.h"
#include "tessel/parallel/layout.h"

namespace tessel::parallel {

class ParamGather {
 public:
  // `units[c]`: the units of this rank's model chunk c, in forward order, each the list of its
  // parameters (distributed, stored Shard over dp by parallelize at sharding stage 3).
  ParamGather(const Layout& layout, std::vector<std::vector<std::vector<nn::Parameter*>>> units);
  ~ParamGather();
  ParamGather(const ParamGather&) = delete;
  ParamGather& operator=(const ParamGather&) = delete;

  // fn(x) with unit `unit` of chunk `chunk` gathered, as described above.
  Tensor run(int chunk, size_t unit, const Tensor& x, const std::function<Tensor(const Tensor&)>& fn);
  // Call after the step's last backward and before the optimizer changes the shards: waits for
  // any gather still in flight and frees every buffer, so the next forward gathers the updated
  // parameters.
  void finish_step();
  // Where the gathered weights' gradients go instead of an immediate reduce-scatter each (the
  // sharded optimizer's buckets): `sink(p, grad)` takes the gradient of p's gathered weight,
  // still a partial sum over dp, and returns true when it has taken it.
  void set_grad_sink(std::function<bool(const nn::Parameter*, const Tensor&)> sink) { sink_ = std::move(sink); }

 private:
  struct Entry;
  struct Unit;
  Unit& unit(int chunk, size_t u);
  void launch(Unit& u);  // restores the buffers and starts their gathers
  void wait(Unit& u);    // until the gathers are done

  const Layout& layout_;
  std::vector<std::vector<std::unique_ptr<Unit>>> chunks_;
  std::function<bool(const nn::Parameter*, const Tensor&)> sink_;
};

}  // namespace tessel::parallel
