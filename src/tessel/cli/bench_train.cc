// Training throughput benchmark.
#include "tessel/cli/bench_train.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>

#include "tessel/cli/trainer.h"
#include "tessel/core/context.h"
#include "tessel/core/philox.h"
#include "tessel/core/thread_pool.h"

namespace tessel {

double measure_sgemm_peak() {
  double best = 0;
  for (int n : {1024, 1536}) {
    Tensor a = Tensor::empty({n, n}), b = Tensor::empty({n, n}), c = Tensor::empty({n, n});
    rng_fill(a, Distribution::uniform, -1, 1, 1, 1);
    rng_fill(b, Distribution::uniform, -1, 1, 1, 2);
    std::vector<double> times;
    for (int rep = 0; rep < 7; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data<float>(), n, b.data<float>(), n, 0.0f,
                  c.data<float>(), n);
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    best = std::max(best, 2.0 * n * n * static_cast<double>(n) / times[times.size() / 2]);
  }
  return best;
}

Json bench_train(RunConfig config, const TrainBenchOptions& options) {
  if (config.train.threads > 0) set_default_num_threads(static_cast<int>(config.train.threads));
  double peak = measure_sgemm_peak();
  config.train.steps = options.warmup + options.steps;
  config.train.warmup = std::min(config.train.warmup, config.train.steps);
  TrainResult r = train(config, TrainOptions{.progress = false, .quiet = true});
  std::vector<double> times;
  for (size_t i = static_cast<size_t>(options.warmup); i < r.steps.size(); ++i) times.push_back(r.steps[i].seconds);
  std::sort(times.begin(), times.end());
  double step_time = times[times.size() / 2];
  double tokens = static_cast<double>(config.train.global_batch * config.train.seq_len);
  std::unique_ptr<nn::LanguageModel> model = build_model(config);
  double flops = model->train_flops_per_token(config.train.seq_len) * tokens / step_time;
  Json j = Json::Object{};
  j["arch"] = model->arch();
  j["parameters"] = model->num_parameters();
  j["threads"] = current_num_threads();
  j["tokens_per_step"] = tokens;
  j["step_time_s"] = step_time;
  j["tokens_per_s"] = tokens / step_time;
  j["model_flops_per_token"] = model->train_flops_per_token(config.train.seq_len);
  j["model_flops_per_s"] = flops;
  j["sgemm_peak_flops_per_s"] = peak;
  j["share_of_sgemm_peak"] = flops / peak;
  j["final_loss"] = r.steps.back().loss;
  return j;
}

}  // namespace tessel
