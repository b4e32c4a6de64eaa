// The engine from C++, with no YAML: a run described as values (model, data, optimizer and the
// strategy), fitted on 4 thread ranks laid out data x tensor parallel with ZeRO-2, then
// evaluated and asked for logits — and the same run on one rank, the oracle. The losses, the
// validation loss and the logits must agree.
//
//   build/release/examples/engine_fit        (exit status 1 when they differ)
#include <cmath>
#include <cstdio>
#include <mutex>

#include "tessel/comm/thread_backend.h"
#include "tessel/engine/engine.h"

using namespace tessel;

namespace {

RunConfig run(int64_t dp, int64_t tp, int64_t stage) {
  RunConfig c;
  c.model.arch = "gpt2";
  c.model.gpt2 = {.n_layer = 2, .n_embd = 32, .n_head = 4, .vocab_size = 256, .n_positions = 32};
  c.data.path = std::string(TESSEL_SOURCE_DIR) + "/data/kjv.txt";  // bytes as tokens
  c.data.val_fraction = 0.05;
  c.train = {.steps = 6, .global_batch = 8, .micro_batch = 8, .seq_len = 32, .lr = 3e-3, .min_lr = 3e-4};
  c.train.eval_batches = 2;
  c.log.every = 1000;
  c.parallel.dp = dp;
  c.parallel.tp = tp;
  c.parallel.sharding_stage = stage;
  return c;
}

struct Outcome {
  std::vector<double> losses;
  double validation = 0;
  std::vector<double> logits;
};

// Fits an Engine of `config` on every rank of a world of `ranks` thread ranks; rank 0's view.
Outcome fit(const RunConfig& config, int ranks) {
  Outcome out;
  std::mutex mu;
  std::vector<int64_t> ids(2 * 16);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>("In the beginning God created the"[i % 31]);
  spawn(ranks, [&](int rank) {
    Engine engine(config);
    ParallelTrainResult r = engine.fit(ParallelTrainOptions{.base = TrainOptions{.quiet = true}});
    const double validation = engine.evaluate();
    const Tensor logits = engine.predict(Tensor::from_vector(ids, {2, 16}));
    if (rank != 0) return;
    std::lock_guard lock(mu);
    for (const StepRecord& s : r.train.steps) out.losses.push_back(s.loss);
    out.validation = validation;
    out.logits = logits.to_doubles();
  });
  return out;
}

}  // namespace

int main() {
  try {
    const Outcome one = fit(run(1, 1, 0), 1);
    const Outcome four = fit(run(2, 2, 2), 4);
    double worst = 0;
    for (size_t s = 0; s < one.losses.size(); ++s) {
      std::printf("step %zu: loss %.6f on one rank, %.6f on dp 2 x tp 2 (ZeRO-2)\n", s, one.losses[s], four.losses[s]);
      worst = std::max(worst, std::abs(one.losses[s] - four.losses[s]) / one.losses[s]);
    }
    std::printf("validation loss: %.6f on one rank, %.6f on four\n", one.validation, four.validation);
    worst = std::max(worst, std::abs(one.validation - four.validation) / one.validation);
    double logit_diff = 0;
    for (size_t i = 0; i < one.logits.size(); ++i) logit_diff = std::max(logit_diff, std::abs(one.logits[i] - four.logits[i]));
    std::printf("logits [2, 16, 256]: largest difference %.1e\n", logit_diff);
    const bool same = one.losses.size() == 6 && four.losses.size() == 6 && worst < 1e-4 && logit_diff < 1e-3;
    std::printf("%s: the four-rank engine %s the one-rank engine (worst relative loss difference %.1e)\n",
                same ? "PASS" : "FAIL", same ? "trains like" : "differs from", worst);
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
