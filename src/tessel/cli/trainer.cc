// `tessel train` on one rank: the engine on a world of one.
#include "tessel/cli/trainer.h"

#include "tessel/engine/engine.h"

namespace tessel {

TrainResult train(const RunConfig& config, const TrainOptions& options,
                  const std::function<void(const StepRecord&)>& on_step) {
  RunConfig one = config;
  one.parallel.dp = one.parallel.tp = one.parallel.pp = 1;
  ParallelTrainResult r = train_parallel_threads(one, 1, ParallelTrainOptions{.base = options, .on_step = on_step});
  r.train.final_params = std::move(r.final_params);
  return std::move(r.train);
}

}  // namespace tessel
