// Fused attention (scaled_dot_product_attention) forward + backward against the unfused
// kernel it replaced (bench/attention_reference.cc, which keeps P [B, H, T, S]), measured in
// the same run: median wall time and the peak bytes tessel's allocator saw (MemoryStats of
// the rank: inputs, outputs, gradients and everything saved between the passes), at a fixed
// number of tokens B·T and GPT-2-tiny widths (configs/gpt2-tiny.yaml: 4 heads of 64), causal.
// Memory linear in the sequence shows as a peak that stays flat as T grows at fixed B·T; the
// unfused kernel's grows with T (B·H·T² values of P). The last line runs T = 8k as packed
// documents of 1k tokens, where the kernel skips the key blocks of other documents.
// bench/attention_vs_pytorch.py runs this with --json beside PyTorch's explicit attention.
// --dropout P adds, for each T up to 4k, the fused kernel with dropout P on the probabilities
// (each mask drawn from Philox in the forward and again in the backward) beside it without.
// --rounds N runs the unfused and the fused kernel in turn N times at each T (on a shared host
// the unfused kernel's time moves by as much as the ratio's margin within an hour; turns give
// each ratio one state of the host) and prints every round's speedup with their median.
//
//   attention_bench [--threads 1] [--tokens 32768] [--t 1024,2048,...] [--reps 3] [--rounds 1]
//                   [--unfused-max-t 4096] [--clock wall|cpu] [--dropout P] [--no-causal] [--json]
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention_reference.h"
#include "bench_util.h"
#include "tessel/autograd/engine.h"
#include "tessel/core/context.h"
#include "tessel/core/storage.h"
#include "tessel/ops/ops.h"

namespace tessel::bench {
namespace {

constexpr int64_t kHeads = 4, kHeadDim = 64;

struct Figures {
  double median_ms = 0;      // forward + backward
  double forward_ms = 0;     // median of the forward alone
  int64_t peak_bytes = 0;   // allocator peak during forward + backward, inputs included
  int64_t saved_bytes = 0;  // allocated by the forward and alive when the backward starts
};

Tensor uniform(const Shape& s, uint64_t seed) {
  Tensor t = Tensor::empty(s, DType::f32);
  float* p = t.data<float>();
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0, n = t.numel(); i < n; ++i) {  // splitmix64: cheap, reproducible inputs
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    p[i] = static_cast<float>(static_cast<double>(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
  }
  return t;
}

using Attention = std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>;

// Milliseconds on the chosen clock: wall time, or the process's CPU time (all its threads) —
// the steadier figure on a machine shared with other work, equal to wall time at one thread
// when the thread is never descheduled.
bool g_cpu_clock = false;
double now_ms() {
  timespec ts{};
  clock_gettime(g_cpu_clock ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

Figures measure(int64_t B, int64_t T, int reps, const Attention& attn) {
  MemoryStats& mem = *rank_context().memory;
  std::vector<double> ms, fwd;
  Figures f;
  for (int r = 0; r < reps; ++r) {
    const int64_t base = mem.current.load();
    Tensor q = uniform({B, kHeads, T, kHeadDim}, 1).set_requires_grad();
    Tensor k = uniform({B, kHeads, T, kHeadDim}, 2).set_requires_grad();
    Tensor v = uniform({B, kHeads, T, kHeadDim}, 3).set_requires_grad();
    Tensor gy = uniform({B, kHeads, T, kHeadDim}, 4);
    mem.reset_peak();
    const double t0 = now_ms();
    const int64_t before = mem.current.load();
    Tensor y = attn(q, k, v);
    const double tf = now_ms();
    f.saved_bytes = mem.current.load() - before;
    backward(y, gy);
    const double t1 = now_ms();
    f.peak_bytes = mem.peak.load() - base;
    ms.push_back(t1 - t0);
    fwd.push_back(tf - t0);
  }
  f.median_ms = median(ms);
  f.forward_ms = median(fwd);
  return f;
}

// Several rounds' figures as one: the median of their medians; the memory, the same each round,
// from the last.
Figures over_rounds(const std::vector<Figures>& rounds) {
  Figures f = rounds.back();
  std::vector<double> ms, fwd;
  for (const Figures& r : rounds) {
    ms.push_back(r.median_ms);
    fwd.push_back(r.forward_ms);
  }
  f.median_ms = median(ms);
  f.forward_ms = median(fwd);
  return f;
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> out;
  for (const char* p = s; *p != '\0';) {
    char* end = nullptr;
    out.push_back(std::strtoll(p, &end, 10));
    p = *end == ',' ? end + 1 : end;
    if (end == p && *end != '\0') break;
  }
  return out;
}

int run(int argc, char** argv) {
  int threads = 1, reps = 3, rounds = 1;
  int64_t tokens = 32768, unfused_max_t = 4096;
  std::vector<int64_t> ts{1024, 2048, 4096, 8192, 16384, 32768};
  bool json = false, causal = true;
  double dropout = 0.0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      fmt::print(
          "usage: attention_bench [--threads 1] [--tokens 32768] [--t 1024,2048,...] [--reps 3] [--rounds 1]\n"
          "                       [--unfused-max-t 4096] [--clock wall|cpu] [--dropout P] [--no-causal] [--json]\n"
          "Fused attention forward + backward beside the unfused kernel it replaced, in the same run: median\n"
          "time and the allocator's peak bytes at each sequence length T, B*T fixed (--tokens).\n"
          "--rounds N measures the two kernels N times in turn at each T up to --unfused-max-t (each round\n"
          "--reps of each) and prints every round's speedup; the table then gives the medians over the rounds\n"
          "(the upper of the middle two for an even N).\n");
      return 0;
    }
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--threads") threads = std::atoi(next());
    else if (a == "--tokens") tokens = std::atoll(next());
    else if (a == "--t") ts = parse_list(next());
    else if (a == "--reps") reps = std::atoi(next());
    else if (a == "--rounds")
      rounds = std::atoi(next());
    else if (a == "--unfused-max-t") unfused_max_t = std::atoll(next());
    else if (a == "--json") json = true;
    else if (a == "--no-causal")
      causal = false;
    else if (a == "--clock") g_cpu_clock = std::string(next()) == "cpu";
    else if (a == "--dropout")
      dropout = std::atof(next());
    else throw std::runtime_error("unknown argument " + a);
  }
  if (reps < 1 || rounds < 1) throw std::runtime_error("--reps and --rounds must be at least 1");
  set_default_num_threads(threads);
  // As `tessel` does at start: OpenBLAS's idle worker would otherwise poll with sched_yield
  // through the run, and the process's CPU-time clock counts it (about 5% of either kernel).
  quiet_blas_workers();
  if (!json)
    fmt::print(
        "attention forward+backward, {}, H={} D={} B*T={} f32, {} thread(s), {} time, median of {} (1 at T >= 8k)\n"
        "{:>6} {:>3} | {:>17} {:>9} {:>9} | {:>17} {:>9} {:>9} | {:>7}\n",
        causal ? "causal" : "not causal", kHeads, kHeadDim, tokens, threads, g_cpu_clock ? "CPU" : "wall", reps, "T",
        "B", "fused ms (fwd)", "peak MiB", "saved MiB", "unfused ms (fwd)", "peak MiB", "saved MiB", "speedup");
  std::map<int64_t, Figures> fused_at;
  auto fused = [causal](const Tensor& q, const Tensor& k, const Tensor& v) {
    return scaled_dot_product_attention(q, k, v, causal);
  };
  auto unfused = [causal](const Tensor& q, const Tensor& k, const Tensor& v) {
    return unfused_attention(q, k, v, causal);
  };
  for (int64_t T : ts) {
    const int64_t B = std::max<int64_t>(1, tokens / T);
    const int n = T >= 8192 ? 1 : reps;
    const bool with_unfused = T <= unfused_max_t;
    // The unfused kernel first: a page-faulting first touch of fresh memory then hits it, not
    // the fused one. With rounds, the two take turns, so that each ratio compares the kernels
    // under the same state of a shared host.
    std::vector<Figures> us, fs;
    std::vector<double> speedups;
    for (int r = 0; r < (with_unfused ? rounds : 1); ++r) {
      if (with_unfused) us.push_back(measure(B, T, n, unfused));
      fs.push_back(measure(B, T, n, fused));
      if (with_unfused) speedups.push_back(us.back().median_ms / fs.back().median_ms);
    }
    Figures u = with_unfused ? over_rounds(us) : Figures{};
    Figures f = over_rounds(fs);
    fused_at[T] = f;
    if (json) {
      fmt::print("{{\"T\": {}, \"B\": {}, \"fused_ms\": {:.3f}, \"fused_forward_ms\": {:.3f}, "
                 "\"fused_peak_bytes\": {}, \"fused_saved_bytes\": {}",
                 T, B, f.median_ms, f.forward_ms, f.peak_bytes, f.saved_bytes);
      if (with_unfused)
        fmt::print(
            ", \"unfused_ms\": {:.3f}, \"unfused_forward_ms\": {:.3f}, \"unfused_peak_bytes\": {}, "
            "\"unfused_saved_bytes\": {}, \"speedup_rounds\": [{:.4f}], \"speedup\": {:.4f}",
            u.median_ms, u.forward_ms, u.peak_bytes, u.saved_bytes, fmt::join(speedups, ", "), median(speedups));
      fmt::print("}}\n");
    } else {
      auto ms = [](const Figures& x) { return fmt::format("{:.1f} ({:.1f})", x.median_ms, x.forward_ms); };
      std::string right = with_unfused ? fmt::format("{:>17} {:>9.1f} {:>9.1f} | {:>6.2f}x", ms(u), mib(u.peak_bytes),
                                                     mib(u.saved_bytes), median(speedups))
                                       : fmt::format("{:>17} {:>9} {:>9} | {:>7}", "-", "-", "-", "-");
      fmt::print("{:>6} {:>3} | {:>17} {:>9.1f} {:>9.1f} | {}\n", T, B, ms(f), mib(f.peak_bytes), mib(f.saved_bytes),
                 right);
      if (speedups.size() > 1) {
        const auto [lo, hi] = std::minmax_element(speedups.begin(), speedups.end());
        fmt::print("       speedup by round: {:.2f}x; median {:.2f}x, range {:.2f}x-{:.2f}x over {} rounds\n",
                   fmt::join(speedups, "x "), median(speedups), *lo, *hi, speedups.size());
      }
    }
    std::fflush(stdout);
  }
  if (fused_at.count(8192) && fused_at.count(32768) && !json)
    fmt::print("fused peak growth T=8k -> 32k: {:.2f}x (acceptance: <= 4.5x)\n",
               static_cast<double>(fused_at[32768].peak_bytes) / static_cast<double>(fused_at[8192].peak_bytes));
  // Packed documents: T = 8k as 8 documents of 1k against one causal sequence of 8k.
  if (fused_at.count(8192)) {
    const int64_t T = 8192, B = std::max<int64_t>(1, tokens / T), N = 8;
    std::vector<int64_t> starts;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t d = 0; d < N; ++d) starts.push_back(d * T / N);
    Tensor docs = Tensor::from_vector(starts, {B, N});
    Figures f = measure(B, T, 1, [&docs](const Tensor& q, const Tensor& k, const Tensor& v) {
      return scaled_dot_product_attention(q, k, v, docs, true);
    });
    if (json)
      fmt::print("{{\"T\": {}, \"B\": {}, \"docs\": {}, \"fused_ms\": {:.3f}, \"fused_peak_bytes\": {}}}\n", T, B, N,
                 f.median_ms, f.peak_bytes);
    else
      fmt::print("T=8k as {} documents of 1k: {:.1f} ms (one 8k sequence: {:.1f} ms, {:.2f}x), peak {:.1f} MiB\n", N,
                 f.median_ms, fused_at[8192].median_ms, fused_at[8192].median_ms / f.median_ms, mib(f.peak_bytes));
  }
  for (const auto& [T, plain] : fused_at) {
    if (dropout <= 0.0 || T > 4096) continue;
    const int64_t B = std::max<int64_t>(1, tokens / T);
    Figures f = measure(B, T, reps, [dropout](const Tensor& q, const Tensor& k, const Tensor& v) {
      return scaled_dot_product_attention(q, k, v, Tensor(), true, 0.0, {}, SdpaDropout{dropout, 1, 2, 0});
    });
    if (json)
      fmt::print("{{\"T\": {}, \"B\": {}, \"dropout\": {}, \"fused_ms\": {:.3f}, \"fused_peak_bytes\": {}}}\n", T, B,
                 dropout, f.median_ms, f.peak_bytes);
    else
      fmt::print(
          "T={} with dropout {} on the probabilities: {:.1f} ms (fwd {:.1f}), without {:.1f} ms: {:.2f}x the time, "
          "peak {:.1f} MiB\n",
          T, dropout, f.median_ms, f.forward_ms, plain.median_ms, f.median_ms / plain.median_ms, mib(f.peak_bytes));
  }
  return 0;
}

}  // namespace
}  // namespace tessel::bench

int main(int argc, char** argv) {
  try {
    return tessel::bench::run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
}
