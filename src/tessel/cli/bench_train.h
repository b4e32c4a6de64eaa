// `tessel bench train`: tokens/s and achieved model FLOP/s of a training config, beside the
// sgemm peak measured with the same thread count in the same run.
#pragma once

#include "tessel/cli/config.h"
#include "tessel/core/json.h"

namespace tessel {

struct TrainBenchOptions {
  int64_t warmup = 2, steps = 10;
};

// Runs warmup + steps training steps and returns the figures as JSON: tokens_per_s,
// step_time_s (median), model_flops_per_s, sgemm_peak_flops_per_s, share_of_sgemm_peak,
// threads, parameters.
Json bench_train(RunConfig config, const TrainBenchOptions& options);

// The best median rate of sgemm (kernels::gemm: BLAS tiles over the pool) on a few large shapes
// with the current threads, in FLOP/s.
double measure_sgemm_peak();

}  // namespace tessel
