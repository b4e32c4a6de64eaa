// Training throughput benchmark.
#include "tessel/cli/bench_train.h"

#include <algorithm>
#include <chrono>

#include "tessel/cli/trainer.h"
#include "tessel/core/context.h"
#include "tessel/core/philox.h"
#include "tessel/core/thread_pool.h"
#include "tessel/ops/kernel_util.h"

namespace tessel {

namespace {

// The host's sgemm peak, the reference the benchmark prints beside its figures: host buffers
// and the CPU's GEMM, whatever device the run trains on.
struct Gemm {
  int n;
  std::vector<float> a, b;
  mutable std::vector<float> c;
  explicit Gemm(int size) : n(size), a(static_cast<size_t>(size) * size), b(a.size()), c(a.size()) {
    rng_fill(Tensor::borrow_host(a.data(), {size, size}, DType::f32), Distribution::uniform, -1, 1, 1, 1);
    rng_fill(Tensor::borrow_host(b.data(), {size, size}, DType::f32), Distribution::uniform, -1, 1, 1, 2);
  }
  // GFLOP/s of one call.
  double run() const {
    auto t0 = std::chrono::steady_clock::now();
    kernels::gemm<float>(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return 2.0 * n * n * static_cast<double>(n) / s;
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

double measure_sgemm_peak() {
  double best = 0;
  for (int n : {1024, 1536}) {
    Gemm g(n);
    std::vector<double> rates;
    for (int rep = 0; rep < 7; ++rep) rates.push_back(g.run());
    best = std::max(best, median(rates));
  }
  return best;
}

// The peak is sampled right after every measured step (an sgemm of 1536³), so each step's
// achieved FLOP/s is compared with the peak of the same moment; machine noise that drifts
// moves both. The reported share is the median of those per-step ratios.
Json bench_train(RunConfig config, const TrainBenchOptions& options) {
  if (config.train.threads > 0) set_default_num_threads(static_cast<int>(config.train.threads));
  Gemm probe(1536);
  probe.run();
  std::unique_ptr<nn::LanguageModel> model = build_model(config);
  const double tokens = static_cast<double>(config.train.global_batch * config.train.seq_len);
  const double step_flops = model->train_flops_per_token(config.train.seq_len) * tokens;
  config.train.steps = options.warmup + options.steps;
  config.train.warmup = std::min(config.train.warmup, config.train.steps);
  std::vector<double> times, peaks, shares;
  TrainResult r = train(config, TrainOptions{.progress = false, .quiet = true}, [&](const StepRecord& s) {
    if (s.step < options.warmup) return;
    double peak = probe.run();
    times.push_back(s.seconds);
    peaks.push_back(peak);
    shares.push_back(step_flops / s.seconds / peak);
  });
  double step_time = median(times);
  Json j = Json::Object{};
  j["arch"] = model->arch();
  j["parameters"] = model->num_parameters();
  j["threads"] = current_num_threads();
  j["tokens_per_step"] = tokens;
  j["step_time_s"] = step_time;
  j["tokens_per_s"] = tokens / step_time;
  j["model_flops_per_token"] = model->train_flops_per_token(config.train.seq_len);
  j["model_flops_per_s"] = step_flops / step_time;
  j["sgemm_peak_flops_per_s"] = median(peaks);
  j["share_of_sgemm_peak"] = median(shares);
  j["final_loss"] = r.steps.back().loss;
  return j;
}

}  // namespace tessel
