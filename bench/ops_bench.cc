// Op kernel benchmarks (Google Benchmark), single-threaded. Every tessel kernel is timed in
// alternation with its reference inside the same benchmark — matmul against a direct
// cblas_sgemm of the same shape, memory-bound kernels against a memcpy of the same bytes —
// and the medians of both are reported with their ratio, so machine noise that drifts
// affects both sides alike. The single-core sgemm peak (best cblas_sgemm median over a few
// large shapes) is printed too. Bandwidth counts bytes read plus bytes written.
//
//   build/release/bench/ops_bench [--benchmark_filter=REGEX] [--benchmark_min_time=SECONDS]
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <string>

#include "bench_util.h"
#include "tessel/core/context.h"
#include "tessel/core/philox.h"
#include "tessel/core/view.h"
#include "tessel/autograd/engine.h"
#include "tessel/nn/moe.h"
#include "tessel/ops/attention.h"
#include "tessel/ops/ops.h"

using namespace tessel;

namespace {

using Clock = std::chrono::steady_clock;

Tensor random(const Shape& shape) {
  Tensor t = Tensor::empty(shape);
  rng_fill(t, Distribution::normal, 0, 1, 1, stream_key("bench"));
  return t;
}

using tessel::bench::median;

double seconds(const std::function<void()>& f) {
  auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Times `ours` and `reference` alternately each iteration; reports both medians as rates of
// `work` units per second (`unit`) and their ratio.
void paired(benchmark::State& state, double work, const char* unit, const std::function<void()>& ours,
            const std::function<void()>& reference) {
  std::vector<double> a, b;
  ours();  // warm up allocations and caches
  reference();
  for (auto _ : state) {
    double ta = seconds(ours), tb = seconds(reference);
    a.push_back(ta);
    b.push_back(tb);
    state.SetIterationTime(ta + tb);
  }
  double ra = work / median(a), rb = work / median(b);
  state.counters[std::string("tessel_") + unit] = ra;
  state.counters[std::string("ref_") + unit] = rb;
  state.counters["ratio_%"] = 100.0 * ra / rb;
}

void sgemm(int64_t m, int64_t n, int64_t k, const Tensor& a, const Tensor& b, const Tensor& c) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
              1.0f, a.data<float>(), static_cast<int>(k), b.data<float>(), static_cast<int>(n), 0.0f, c.data<float>(),
              static_cast<int>(n));
}

// ---- the reference peak: direct cblas_sgemm on large square-ish shapes ----
void BM_sgemm_peak(benchmark::State& state) {
  int64_t n = state.range(0);
  Tensor a = random({n, n}), b = random({n, n}), c = Tensor::empty({n, n});
  std::vector<double> t;
  for (auto _ : state) {
    double s = seconds([&] { sgemm(n, n, n, a, b, c); });
    t.push_back(s);
    state.SetIterationTime(s);
  }
  state.counters["GFLOP/s"] = 2.0 * static_cast<double>(n * n * n) / median(t) / 1e9;
}
BENCHMARK(BM_sgemm_peak)->Name("ref/sgemm_peak")->Arg(1200)->Arg(1536)->Arg(2000)->UseManualTime();

// ---- matmul and linear against cblas_sgemm of the same shape ----
void BM_matmul(benchmark::State& state) {
  int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  Tensor a = random({m, k}), b = random({k, n}), c = Tensor::empty({m, n});
  paired(state, 2.0 * static_cast<double>(m * n * k) / 1e9, "GFLOP/s",
         [&] { benchmark::DoNotOptimize(matmul(a, b)); }, [&] { sgemm(m, n, k, a, b, c); });
}
BENCHMARK(BM_matmul)->Name("matmul_MxKxN")->Args({1024, 1024, 1024})->Args({1024, 768, 3072})
    ->Args({1024, 3072, 768})->Args({1024, 768, 768})->Args({2048, 1024, 4096})->UseManualTime();

// A transformer projection as a model runs it: x[8, 128, 768] @ w[3072, 768]^T + bias.
void BM_linear(benchmark::State& state) {
  Tensor x = random({8, 128, 768}), w = random({3072, 768}), bias = random({3072});
  Tensor wt = view::contiguous(view::transpose(w, 0, 1)), c = Tensor::empty({1024, 3072});
  paired(state, 2.0 * 1024.0 * 768.0 * 3072.0 / 1e9, "GFLOP/s", [&] { benchmark::DoNotOptimize(linear(x, w, bias)); },
         [&] { sgemm(1024, 3072, 768, view::reshape(x, {1024, 768}), wt, c); });
}
BENCHMARK(BM_linear)->Name("linear_1024x768x3072")->UseManualTime();

// ---- attention: forward + backward through autograd, against the plain (full T×S) gemms ----
// The reference is what a non-fused attention must at least run per (batch, head): the six
// cblas_sgemm calls of scores, P·V and the four backward products, over the whole T×S even
// when causal. FLOPs are counted that way on both sides (the model-FLOPs convention), so a
// causal kernel that skips the masked half can exceed 100%.
void BM_sdpa(benchmark::State& state) {
  const int64_t B = 8, H = 4, T = state.range(0), D = 64;
  const bool causal = state.range(1) != 0;
  Tensor q = random({B, H, T, D}), k = random({B, H, T, D}), v = random({B, H, T, D});
  for (const Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
  Tensor s = Tensor::empty({T, T}), o = Tensor::empty({T, D}), g = random({T, D});
  auto ref = [&] {
    float *sp = s.data<float>(), *op = o.data<float>();
    const float *qp = q.data<float>(), *kp = k.data<float>(), *gp = g.data<float>();
    const int t = static_cast<int>(T), d = static_cast<int>(D);
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const float *qh = qp + bh * T * D, *kh = kp + bh * T * D;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, d, 1.0f, qh, d, kh, d, 0.0f, sp, t);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t, d, t, 1.0f, sp, t, kh, d, 0.0f, op, d);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t, d, t, 1.0f, sp, t, gp, d, 1.0f, op, d);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, d, 1.0f, gp, d, kh, d, 0.0f, sp, t);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t, d, t, 1.0f, sp, t, kh, d, 0.0f, op, d);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t, d, t, 1.0f, sp, t, qh, d, 1.0f, op, d);
    }
  };
  Tensor go = random({B, H, T, D});
  auto ours = [&] {
    Tensor y = scaled_dot_product_attention(q, k, v, causal);
    backward(y, go);
  };
  paired(state, 12.0 * static_cast<double>(B * H * T * T * D) / 1e9, "GFLOP/s", ours, ref);
}
BENCHMARK(BM_sdpa)->Name("sdpa_fwd_bwd_B8_H4_T_D64_causal")->Args({128, 1})->Args({128, 0})->Args({512, 1})
    ->UseManualTime();

// ---- grouped GEMM (an MoE layer's experts) against one dense GEMM of the same FLOPs ----
// N tokens routed unevenly to E experts (counts from a fixed skewed split, one expert empty),
// x[N, K] through w[E, K, F], forward and backward through autograd; the reference is the same
// work as one dense product x[N, K] @ W[K, F], forward and backward through autograd. Issue
// 29's goal: the grouped form at >= 70% of the dense one's rate.
void BM_grouped_matmul(benchmark::State& state) {
  const int64_t N = state.range(0), K = state.range(1), F = state.range(2), E = 8;
  const std::vector<int64_t> weights = {9, 1, 5, 0, 12, 3, 7, 3};  // skewed; expert 3 gets nothing
  std::vector<int64_t> counts;
  int64_t given = 0;
  for (int64_t e = 0; e < E; ++e) {
    counts.push_back(e + 1 < E ? N * weights[static_cast<size_t>(e)] / 40 : N - given);
    given += counts.back();
  }
  Tensor x = random({N, K}), w = random({E, K, F}), dense = random({K, F}), gy = random({N, F});
  for (const Tensor* t : {&x, &w, &dense}) t->set_requires_grad(true);
  paired(state, 6.0 * static_cast<double>(N * K * F) / 1e9, "GFLOP/s",
         [&] { backward(grouped_matmul(x, w, counts), gy); }, [&] { backward(matmul(x, dense), gy); });
}
BENCHMARK(BM_grouped_matmul)->Name("grouped_vs_dense_fwd_bwd_NxKxF_E8")->Args({4096, 512, 1024})
    ->Args({8192, 768, 2048})->UseManualTime();

// ---- a whole MoE layer (nn::MoeBlock: router, top-2 of 8 experts, dispatch, grouped SwiGLU
// experts, combine) against the same expert FLOPs as dense products: the three matrices of a
// SwiGLU MLP on N·k token rows, forward and backward through autograd. Issue 29's goal: the
// MoE layer at >= 70% of the dense rate (its routing, gathers and combine count against it).
void BM_moe_layer(benchmark::State& state) {
  const int64_t N = state.range(0), C = state.range(1), F = state.range(2), E = 8, k = 2;
  nn::MoeConfig cfg{.num_experts = E, .top_k = k, .expert_hidden = F, .aux_loss_coef = 0.01, .z_loss_coef = 0.001};
  nn::MoeBlock moe(C, cfg, 0.02, 0);
  moe.finalize_names("moe");
  moe.materialize(1);
  Tensor x = random({1, N, C}), gy = random({1, N, C});
  Tensor xd = random({N * k, C}), w1 = random({C, F}), w3 = random({C, F}), w2 = random({F, C}), gd = random({N * k, C});
  for (const Tensor* t : {&x, &xd, &w1, &w3, &w2}) t->set_requires_grad(true);
  paired(state, 18.0 * static_cast<double>(N * k * C * F) / 1e9, "GFLOP/s", [&] { backward(moe.forward(x), gy); },
         [&] { backward(matmul(mul(silu(matmul(xd, w1)), matmul(xd, w3)), w2), gd); });
}
BENCHMARK(BM_moe_layer)->Name("moe_layer_vs_dense_fwd_bwd_NxCxF_E8k2")->Args({2048, 512, 1024})
    ->Args({4096, 768, 2048})->UseManualTime();

// ---- memory-bound kernels against memcpy of the same bytes ----
const Shape kRows{4096, 1024};
constexpr double kBytes = 4096.0 * 1024.0 * 4.0;

// `tensors` = how many [4096, 1024] f32 tensors the kernel reads or writes.
void memory_bound(benchmark::State& state, int tensors, const std::function<Tensor()>& f) {
  size_t half = static_cast<size_t>(tensors * kBytes / 2);
  std::vector<char> src(half, 1), dst(half, 2);
  paired(state, tensors * kBytes / 1e9, "GB/s", [&] { benchmark::DoNotOptimize(f()); },
         [&] {
           std::memcpy(dst.data(), src.data(), half);
           benchmark::ClobberMemory();
         });
}

void BM_add(benchmark::State& s) {
  Tensor a = random(kRows), b = random(kRows);
  memory_bound(s, 3, [&] { return add(a, b); });
}
void BM_mul_bcast(benchmark::State& s) {
  Tensor a = random(kRows), b = random({1024});
  memory_bound(s, 2, [&] { return mul(a, b); });
}
void BM_scale(benchmark::State& s) {
  Tensor a = random(kRows);
  memory_bound(s, 2, [&] { return scale(a, 0.5, 1.0); });
}
void BM_exp(benchmark::State& s) {
  Tensor a = random(kRows);
  memory_bound(s, 2, [&] { return exp(a); });
}
void BM_gelu(benchmark::State& s) {
  Tensor a = random(kRows);
  memory_bound(s, 2, [&] { return gelu(a, true); });
}
void BM_silu(benchmark::State& s) {
  Tensor a = random(kRows);
  memory_bound(s, 2, [&] { return silu(a); });
}
void BM_layer_norm(benchmark::State& s) {
  Tensor a = random(kRows), w = random({1024}), b = random({1024});
  memory_bound(s, 2, [&] { return layer_norm(a, w, b); });
}
void BM_rms_norm(benchmark::State& s) {
  Tensor a = random(kRows), w = random({1024});
  memory_bound(s, 2, [&] { return rms_norm(a, w); });
}
void BM_softmax(benchmark::State& s) {
  Tensor a = random(kRows);
  memory_bound(s, 2, [&] { return softmax(a, -1); });
}
void BM_log_softmax(benchmark::State& s) {
  Tensor a = random(kRows);
  memory_bound(s, 2, [&] { return log_softmax(a, -1); });
}
BENCHMARK(BM_add)->Name("elementwise/add")->UseManualTime();
BENCHMARK(BM_mul_bcast)->Name("elementwise/mul_broadcast_row")->UseManualTime();
BENCHMARK(BM_scale)->Name("elementwise/scale")->UseManualTime();
BENCHMARK(BM_exp)->Name("elementwise/exp")->UseManualTime();
BENCHMARK(BM_gelu)->Name("elementwise/gelu_tanh")->UseManualTime();
BENCHMARK(BM_silu)->Name("elementwise/silu")->UseManualTime();
BENCHMARK(BM_layer_norm)->Name("norm/layer_norm")->UseManualTime();
BENCHMARK(BM_rms_norm)->Name("norm/rms_norm")->UseManualTime();
BENCHMARK(BM_softmax)->Name("softmax/softmax")->UseManualTime();
BENCHMARK(BM_log_softmax)->Name("softmax/log_softmax")->UseManualTime();

// Prints a summary table after the usual console output.
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) rows_.push_back({r.run_name.str(), r.counters});
  }
  void Summary() const {
    double peak = 0;
    for (const auto& [name, c] : rows_)
      if (name.rfind("ref/sgemm_peak", 0) == 0) peak = std::max(peak, c.at("GFLOP/s").value);
    std::printf("\nsummary, 1 thread (medians; each kernel timed in alternation with its reference)\n");
    std::printf("single-core sgemm peak (best cblas_sgemm): %.1f GFLOP/s\n\n", peak);
    std::printf("%-36s %14s %14s %8s\n", "kernel", "tessel", "reference", "ratio");
    for (const auto& [name, c] : rows_) {
      if (name.rfind("ref/", 0) == 0) continue;
      bool flops = c.count("tessel_GFLOP/s") != 0;
      const char* unit = flops ? "GFLOP/s" : "GB/s";
      double ours = c.at(std::string("tessel_") + unit).value, ref = c.at(std::string("ref_") + unit).value;
      std::string short_name = name.substr(0, name.find("/manual_time"));
      std::printf("%-36s %7.2f %-6s %7.2f %-6s %6.1f%%  of %s%s\n", short_name.c_str(), ours, unit, ref, unit,
                  100.0 * ours / ref,
                  !flops                             ? "memcpy, same bytes"
                  : name.rfind("grouped", 0) == 0 ? "one dense tessel matmul, same FLOPs"
                  : name.rfind("moe", 0) == 0 ? "dense SwiGLU matmuls on N·k rows, same FLOPs"
                                                     : "cblas_sgemm, same shape",
                  flops && peak > 0 ? fmt::format(" ({:.0f}% of peak)", 100.0 * ours / peak).c_str() : "");
    }
  }

 private:
  std::vector<std::pair<std::string, benchmark::UserCounters>> rows_;
};

}  // namespace

int main(int argc, char** argv) {
  set_default_num_threads(1);
  std::vector<char*> args{argv[0]};
  std::string defaults[] = {"--benchmark_min_time=0.5"};  // flags given on the command line win
  for (std::string& d : defaults) args.push_back(d.data());
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.Summary();
  benchmark::Shutdown();
  return 0;
}
