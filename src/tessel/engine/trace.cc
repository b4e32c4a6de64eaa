// Tracing a rank's training step in meta mode over a trace world.
#include "tessel/engine/trace.h"

#include <exception>
#include <thread>

#include "tessel/comm/trace_backend.h"
#include "tessel/comm/world.h"
#include "tessel/core/context.h"

namespace tessel {

CommStats RankTrace::comm() const {
  CommStats out;
  for (const GroupStats& g : groups) out += g.stats;
  return out;
}

RankTrace trace_rank_step(const RunConfig& config, int rank, int steps) {
  TESSEL_CHECK(steps >= 1, "trace_rank_step: {} steps", steps);
  const int world_size = static_cast<int>(config.parallel.world_size());
  TESSEL_CHECK(rank >= 0 && rank < world_size, "trace_rank_step: rank {} of a world of {}", rank, world_size);
  RankTrace out;
  out.rank = rank;
  std::exception_ptr error;
  std::thread worker([&] {
    try {
      RankContextScope context(make_rank_context(rank, world_size, 1));
      MetaModeScope meta;
      std::shared_ptr<ProcessGroup> world = make_trace_world(world_size, rank);
      set_world_group(world);
      RunConfig cfg = config;
      cfg.train.steps = steps;
      cfg.train.save_every = 0;
      cfg.train.eval_every = 0;
      cfg.train.memory_save_every = 0;
      cfg.data.val_path.clear();  // a training step: no validation
      cfg.data.val_fraction = 0;
      Engine engine(cfg);
      // Each group's counters before the last step, to keep that step's share.
      std::map<std::string, CommStats> before;
      ParallelTrainOptions opts{.base = TrainOptions{.progress = false, .quiet = true}};
      int64_t seen = 0;
      opts.on_step = [&](const StepRecord&) {
        if (++seen != steps - 1) return;
        for (const GroupStats& g : world->stats_by_group()) before[g.name] = g.stats;
        reset_op_trace();
      };
      if (steps == 1) reset_op_trace();
      const ParallelTrainResult r = engine.fit(opts);
      out.memory = r.memory;
      out.ops = op_trace();
      for (GroupStats& g : world->stats_by_group()) {
        g.stats = g.stats - before[g.name];
        if (!g.stats.ops.empty()) out.groups.push_back(std::move(g));
      }
    } catch (...) {
      error = std::current_exception();
    }
  });
  worker.join();
  if (error) std::rethrow_exception(error);
  return out;
}

}  // namespace tessel
