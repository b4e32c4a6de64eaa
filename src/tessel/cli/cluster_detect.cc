// Measuring this machine as the `local` cluster. Each figure is timed the way the cost model
// will use it: one rank's sgemm, one thread's memcpy, the thread backend's all_reduce between
// two ranks, one tiny op through the normal dispatch. Budget: a few seconds in all.
#include "tessel/cli/cluster_detect.h"

#include <hwloc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "tessel/autograd/engine.h"
#include "tessel/cli/bench_comm.h"
#include "tessel/cli/bench_train.h"
#include "tessel/comm/thread_backend.h"
#include "tessel/comm/world.h"
#include "tessel/core/context.h"
#include "tessel/core/error.h"
#include "tessel/core/philox.h"
#include "tessel/core/thread_pool.h"
#include "tessel/ops/dispatch.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/ops/ops.h"
#include "tessel/ops/registry.h"
#include "tessel/optim/optimizer.h"
#include "tessel/plan/cost_model.h"

namespace tessel {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Measured figures keep four significant digits: timing noise over a few seconds is larger.
double sig4(double x) { return std::stod(fmt::format("{:.4g}", x)); }

std::string bytes_text(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return fmt::format("{:.{}f} {}", b, b == static_cast<int64_t>(b) ? 0 : 1, units[u]);
}

// The process default thread count (the intra-op pool, which gemms split over) for a scope.
class ThreadsScope {
 public:
  explicit ThreadsScope(int n) : before_(current_num_threads()) { set_default_num_threads(n); }
  ~ThreadsScope() { set_default_num_threads(before_); }

 private:
  int before_;
};

// The half-dim of an efficiency curve E·d/(d + half) through a kernel's shares at two sizes
// d1 > d2: their ratio R gives half = d1 d2 (R - 1) / (d1 - R d2), within [1, 4096] (no
// slowdown at d2: 1; the whole ratio of the sizes or more: 4096).
double half_dim(double share1, double share2, double d1, double d2) {
  const double ratio = share1 / std::max(share2, 1e-9);
  if (ratio <= 1) return 1.0;
  if (ratio >= 0.999 * d1 / d2) return 4096.0;
  return std::clamp(d1 * d2 * (ratio - 1) / (d1 - ratio * d2), 1.0, 4096.0);
}

// n x n x n sgemm operands; rate(reps) is the FLOP/s of `reps` calls in a row.
struct Square {
  int n;
  std::vector<float> a, b, c;
  explicit Square(int size) : n(size), a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size()) {}
  double rate(int reps) {
    auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i)
      kernels::gemm<float>(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    return 2.0 * n * n * static_cast<double>(n) * reps / seconds_since(t0);
  }
};

struct CommFigures {
  double busbw = 0, latency = 0;
};

// all_reduce on the thread backend with the ranks the plan will run (at least two), one thread
// each: bus bandwidth of 16 MiB (2(n-1)/n * bytes / time) and the time of a 4-byte one. With
// more ranks than cores this is what the ranks get while they share the cores.
CommFigures measure_thread_all_reduce(int ranks) {
  const int kRanks = std::max(2, ranks);
  constexpr int64_t kBig = 16 << 20;
  CommFigures out;
  spawn(
      kRanks,
      [&](int rank) {
        ProcessGroup& g = *world_group();
        std::vector<float> big(kBig / 4, 0.0f);
        float small = 0;
        for (int i = 0; i < 2; ++i) g.all_reduce(big.data(), kBig / 4, DType::f32, ReduceOp::sum);
        std::vector<double> times;
        for (int i = 0; i < 7; ++i) {
          g.barrier();
          auto t0 = Clock::now();
          g.all_reduce(big.data(), kBig / 4, DType::f32, ReduceOp::sum);
          times.push_back(seconds_since(t0));
        }
        for (int i = 0; i < 50; ++i) g.all_reduce(&small, 1, DType::f32, ReduceOp::sum);
        std::vector<double> lat;
        for (int batch = 0; batch < 5; ++batch) {
          g.barrier();
          auto t0 = Clock::now();
          for (int i = 0; i < 200; ++i) g.all_reduce(&small, 1, DType::f32, ReduceOp::sum);
          lat.push_back(seconds_since(t0) / 200);
        }
        if (rank != 0) return;
        out.busbw = 2.0 * (kRanks - 1) / kRanks * static_cast<double>(kBig) / median(times);
        out.latency = median(lat);
      },
      SpawnOptions{.threads_per_rank = 1});
  return out;
}

// Seconds per `add` of two 4-element f32 tensors through the op dispatch, recorded on the
// autograd tape as in training (median of 5 batches of 2000).
double measure_op_overhead() {
  Tensor a = Tensor::ones({4}), b = Tensor::ones({4});
  a.set_requires_grad(true);
  for (int i = 0; i < 200; ++i) a = add(a, b);
  std::vector<double> per_op;
  for (int batch = 0; batch < 5; ++batch) {
    auto t0 = Clock::now();
    for (int i = 0; i < 2000; ++i) a = add(a, b);
    per_op.push_back(seconds_since(t0) / 2000);
  }
  return median(per_op);
}

// The op kinds the cost model distinguishes, timed through tessel's own kernels at the shapes
// of a small transformer layer (2048 tokens, width 256, 4 heads of 64): a linear layer's GEMM
// against the sgemm peak, the attention core against the same, and the rate of the layer's
// elementwise ops.
struct KernelFigures {
  double linear_share = 1, attention_share = 1, stream_bandwidth = 0;
  double small_linear_share = 1;  // a linear whose every dim is 256 or more, 256 at least once
  double small_attention_share = 1;  // the attention core at T = 32 (attention_share: T = 128)
  double sgemm_rate = 0;  // 1024^3 sgemm FLOP/s over all the alternating rounds (time-averaged)
  double optimizer_rate = 0;  // bytes/s of the optimizer step, charged optimizer_step_bytes per parameter
  int64_t optimizer_params = 0;
};

std::vector<TensorMeta> metas(std::initializer_list<Tensor> ts) {
  std::vector<TensorMeta> m;
  for (const Tensor& t : ts) m.push_back(TensorMeta{t.shape(), t.dtype(), {}});
  return m;
}

// A leaf of standard normal values that takes a gradient; each call draws another stream (the
// ranks of a detect call this at once).
Tensor random_input(const Shape& shape) {
  static std::atomic<uint64_t> stream{0};
  Tensor t = Tensor::empty(shape);
  rng_fill(t, Distribution::normal, 0, 1, 7, stream++);
  return t.set_requires_grad(true);
}

KernelFigures measure_kernels() {
  NoGradGuard no_grad;
  Square big(1024);
  big.rate(1);
  // Each kernel alternates with a 1024^3 sgemm; the share is the median of per-round ratios,
  // and the sgemm rounds together give the peak the shares are of (same time window). The peak
  // is their time-averaged rate (all FLOPs over all seconds), not a median: a shared host can
  // switch between a fast and a slow speed every second or two, the median of such rounds
  // lands on one of the two, and a training step runs at the mix.
  double sgemm_flops = 0, sgemm_seconds = 0;
  auto share = [&](const std::function<void()>& f, double flops) {
    f();
    std::vector<double> r;
    for (int i = 0; i < 11; ++i) {
      auto t0 = Clock::now();
      f();
      const double kernel = flops / seconds_since(t0);
      const double sgemm = big.rate(1);
      sgemm_flops += 2.0 * 1024 * 1024 * 1024;
      sgemm_seconds += 2.0 * 1024 * 1024 * 1024 / sgemm;
      r.push_back(kernel / sgemm);
    }
    return median(r);
  };
  KernelFigures k;
  // Forward and backward through autograd, as a training step runs them (the cost model charges
  // a backward of twice the forward's FLOPs: three times in all), on four inputs in turn so the
  // activations come from memory rather than a warm cache.
  // Two shapes give the efficiency curve over a GEMM's smallest dim d: [2048, 1024] x [1024,
  // 1024]^T (d = 1024) and [2048, 256] x [256, 256]^T (d = 256).
  int turn = 0;
  auto linear_share = [&](int64_t in, int64_t out) {
    Tensor w = Tensor::full({out, in}, 0.01), b = Tensor::full({out}, 0.1);
    w.set_requires_grad(true);
    b.set_requires_grad(true);
    std::vector<Tensor> xs;
    for (int i = 0; i < 4; ++i) xs.push_back(Tensor::full({2048, in}, 0.5 + 0.1 * i).set_requires_grad(true));
    Tensor gy = Tensor::full({2048, out}, 1e-3);
    const double flops = op_cost(op_by_name("linear"), metas({xs[0], w, b}), Attrs{{"weight_in_out", false}}).flops;
    GradModeGuard grad_on(true);
    return share(
        [&] {
          const Tensor& xi = xs[static_cast<size_t>(turn++ % 4)];
          backward(linear(xi, w, b), gy);
        },
        3 * flops);
  };
  k.linear_share = linear_share(1024, 1024);
  k.small_linear_share = linear_share(256, 256);
  // The attention core as GPT-2 runs it: q, k and v are views of one packed projection output
  // [B, T, 3 x 256] (split, then [B, T, H, D] -> [B, H, T, D] strided views), and the output is
  // laid back out as [B, T, 256] for the output projection (a copy). q, k and v must be separate
  // tensors: one tensor passed three times keeps a third of the working set and measured some
  // 40% fast. At T = 128 (B = 16, GPT-2 tiny's sequence) and at T = 32 (B = 64, the blocks of a
  // context-parallel ring over such sequences): the kernel's efficiency curve over T.
  constexpr int64_t H = 4, D = 64, C = H * D;
  auto attention_share = [&](int64_t T) {
    const int64_t B = 2048 / T;
    std::vector<Tensor> packed;
    for (int i = 0; i < 4; ++i) packed.push_back(random_input({B, T, 3 * C}));
    Tensor go = Tensor::full({B, T, C}, 1e-3);
    const double scale = 0.125;
    const TensorMeta heads{Shape{B, H, T, D}, DType::f32, {}};
    const double sdpa_flops = op_cost(op_by_name("sdpa"), std::vector<TensorMeta>{heads, heads, heads},
                                      Attrs{{"causal", true}, {"scale", scale}})
                                  .flops;
    GradModeGuard grad_on(true);
    return share(
        [&] {
          std::vector<Tensor> qkv = split(packed[static_cast<size_t>(turn++ % 4)], {C, C, C}, -1);
          auto heads = [&](const Tensor& t) { return permute(reshape(t, {B, T, H, D}), {0, 2, 1, 3}); };
          Tensor y = scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), true, scale);
          backward(reshape(permute(y, {0, 2, 1, 3}), {B, T, C}), go);
        },
        3 * sdpa_flops);
  };
  k.attention_share = attention_share(128);
  k.small_attention_share = attention_share(32);
  // Streaming: the elementwise ops of a GPT-2 layer of width 256 on 2048 tokens (two
  // LayerNorms and two residual adds on [2048, 256], the tanh GELU on [2048, 1024]), forward
  // and backward through autograd, on inputs taken in turn from four sets so that they come
  // from further out than L1/L2, as a step's activations do. The cost model charges each such
  // op three times its forward bytes (registry) at memory_bandwidth; the rate is those bytes
  // over the time, all rounds together. GELU's tanh is compute-bound, and this mix is what a
  // layer runs, so the rate is a layer's, not a copy's.
  {
    GradModeGuard grad_on(true);
    std::vector<Tensor> xs, ys, hs;
    for (int i = 0; i < 4; ++i) {
      xs.push_back(random_input({2048, C}));
      ys.push_back(random_input({2048, C}));
      hs.push_back(random_input({2048, 4 * C}));
    }
    Tensor g = Tensor::ones({C}).set_requires_grad(true), z = Tensor::zeros({C}).set_requires_grad(true);
    Tensor gy = Tensor::full({2048, C}, 1e-3), gh = Tensor::full({2048, 4 * C}, 1e-3);
    const Attrs ln_attrs{{"has_weight", true}, {"has_bias", true}, {"eps", 1e-5}};
    const double ln_bytes = op_cost(op_by_name("layer_norm"), metas({xs[0], g, z}), ln_attrs).bytes;
    const double add_bytes = op_cost(op_by_name("add"), metas({xs[0], ys[0]}), {}).bytes;
    const double gelu_bytes = op_cost(op_by_name("gelu"), metas({hs[0]}), Attrs{{"tanh", true}}).bytes;
    const double charged = 3 * (2 * ln_bytes + 2 * add_bytes + gelu_bytes);
    auto layer = [&](size_t i) {
      for (const Tensor* t : {&xs[i], &ys[i], &hs[i], &g, &z}) t->set_grad(Tensor());
      backward(layer_norm(xs[i], g, z), gy);
      backward(layer_norm(ys[i], g, z), gy);
      backward(add(xs[i], ys[i]), gy);
      backward(add(ys[i], xs[i]), gy);
      backward(gelu(hs[i], true), gh);
    };
    constexpr int kRounds = 12;
    layer(0);
    auto t0 = Clock::now();
    for (int r = 0; r < kRounds; ++r) layer(static_cast<size_t>(r % 4));
    k.stream_bandwidth = charged * kRounds / seconds_since(t0);
  }
  // The optimizer step's kernels as the engine's step calls them (optim::sum_squares and
  // optim::adamw_update, without the ZeRO shards' packing) once a step's gradients are in: the
  // global gradient norm (a read of every gradient), then AdamW with the clip folded in, over the
  // parameters of four GPT-2 layers of width 256 (3.2M, with their gradients and moments 50 MB a
  // rank: a step streams them from beyond the caches a core has). A 1024^3 sgemm runs between
  // steps, as a step's forward and backward do. The rate is the bytes the cost model charges
  // (optimizer_step_bytes, f32) over the time, all rounds together.
  {
    std::vector<optim::ParamRef> params;
    for (int layer = 0; layer < 4; ++layer)
      for (const Shape& shape : {Shape{3 * C, C}, Shape{3 * C}, Shape{C, C}, Shape{C}, Shape{4 * C, C}, Shape{4 * C},
                                 Shape{C, 4 * C}, Shape{C}, Shape{C}, Shape{C}, Shape{C}, Shape{C}}) {
        Tensor p = Tensor::full(shape, 0.01).set_requires_grad(true);
        p.set_grad(Tensor::full(shape, 1e-3));
        params.push_back({fmt::format("layer{}.{}", layer, params.size()), p});
        k.optimizer_params += shape_numel(shape);
      }
    optim::AdamW adamw(params, optim::AdamWOptions{});
    auto step = [&] {
      double squares = 0;
      for (const optim::ParamRef& p : params) squares += optim::sum_squares(p.param.grad());
      adamw.step(optim::clip_coefficient(std::sqrt(squares), 1.0));
    };
    step();  // the moments are made on the first step
    constexpr int kRounds = 7;
    double seconds = 0;
    for (int r = 0; r < kRounds; ++r) {
      big.rate(1);
      auto t0 = Clock::now();
      step();
      seconds += seconds_since(t0);
    }
    const double bytes =
        plan::optimizer_step_bytes(plan::precision_for("f32")) * static_cast<double>(k.optimizer_params);
    k.optimizer_rate = bytes * kRounds / seconds;
  }
  k.sgemm_rate = sgemm_flops / sgemm_seconds;
  return k;
}

std::string hostname() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "unknown host";
  return host;
}

std::string today() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::localtime(&t));
  return buf;
}

}  // namespace

std::string MachineTopology::str() const {
  auto cache = [](const char* name, int64_t bytes, int count) {
    return bytes > 0 ? fmt::format(", {} {} x{}", name, bytes_text(static_cast<double>(bytes)), count) : std::string();
  };
  std::string numa_memory = numa_memory_bytes > 0 && numa_memory_bytes != memory_bytes
                                ? fmt::format(" ({} in NUMA nodes)", bytes_text(numa_memory_bytes))
                                : std::string();
  return fmt::format("{} physical cores, {} PUs, {} NUMA node{}, {} memory{}{}{}{}", cores, pus, numa_nodes,
                     numa_nodes == 1 ? "" : "s", bytes_text(memory_bytes), numa_memory,
                     cache("L1d", l1_bytes, l1_count), cache("L2", l2_bytes, l2_count), cache("L3", l3_bytes, l3_count));
}

MachineTopology probe_topology() {
  MachineTopology m;
  hwloc_topology_t topo;
  const bool initialised = hwloc_topology_init(&topo) == 0;
  if (initialised && hwloc_topology_load(topo) == 0) {
    auto count = [&](hwloc_obj_type_t type) { return std::max(0, hwloc_get_nbobjs_by_type(topo, type)); };
    auto cache = [&](hwloc_obj_type_t type, int64_t& bytes, int& n) {
      n = count(type);
      hwloc_obj_t o = hwloc_get_obj_by_type(topo, type, 0);
      bytes = o != nullptr ? static_cast<int64_t>(o->attr->cache.size) : 0;
    };
    m.cores = count(HWLOC_OBJ_CORE);
    m.pus = count(HWLOC_OBJ_PU);
    m.numa_nodes = count(HWLOC_OBJ_NUMANODE);
    cache(HWLOC_OBJ_L1CACHE, m.l1_bytes, m.l1_count);
    cache(HWLOC_OBJ_L2CACHE, m.l2_bytes, m.l2_count);
    cache(HWLOC_OBJ_L3CACHE, m.l3_bytes, m.l3_count);
    m.numa_memory_bytes = static_cast<double>(hwloc_get_root_obj(topo)->total_memory);
    if (hwloc_obj_t pkg = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, 0))
      if (const char* model = hwloc_obj_get_info_by_name(pkg, "CPUModel")) m.cpu_model = model;
  }
  if (initialised) hwloc_topology_destroy(topo);
  // What hwloc could not tell, from the OS.
  if (m.pus <= 0) m.pus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (m.cores <= 0) m.cores = m.pus;
  if (m.numa_nodes <= 0) m.numa_nodes = 1;
  m.memory_bytes = std::max(m.numa_memory_bytes, static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE));
  return m;
}

plan::Cluster detect_local_cluster(int ranks, bool verbose) {
  auto progress = [&](const char* what) {
    if (verbose) std::fprintf(stderr, "cluster detect: %s\n", what);
  };
  progress("reading the topology (hwloc)...");
  MachineTopology m = probe_topology();
  if (ranks <= 0) ranks = m.cores;
  TESSEL_CHECK(ranks >= 1, "cluster detect: --ranks {}: need at least one rank", ranks);
  // A rank's gemm threads are its share of the cores (one each when ranks >= cores).
  const int threads = std::max(1, m.cores / ranks);
  const std::string origin = fmt::format("measured by tessel cluster detect on {}, {}", hostname(), today());
  // Every core a rank would run on works at once, as the ranks of a training step do: the
  // figures are what one rank gets while the others compute too (cores share caches, memory
  // and, on virtual machines, sometimes a physical core).
  const int concurrent = std::max(1, std::min(ranks, m.cores / threads));

  double peak = 0, best_peak = 0;
  KernelFigures kernels;
  {
    progress(fmt::format("measuring sgemm peak and tessel's kernels ({} rank{} at once, {} thread{} each)...",
                         concurrent, concurrent == 1 ? "" : "s", threads, threads == 1 ? "" : "s")
                 .c_str());
    std::vector<double> best(static_cast<size_t>(concurrent)), typical(static_cast<size_t>(concurrent)),
        linear_share(best.size()), small_share(best.size()), attention_share(best.size()),
        small_attention_share(best.size()), stream(best.size()), optimizer(best.size());
    spawn(
        concurrent,
        [&](int rank) {
          const size_t r = static_cast<size_t>(rank);
          best[r] = measure_sgemm_peak();
          KernelFigures k = measure_kernels();
          typical[r] = k.sgemm_rate;
          linear_share[r] = k.linear_share;
          small_share[r] = k.small_linear_share;
          attention_share[r] = k.attention_share;
          small_attention_share[r] = k.small_attention_share;
          stream[r] = k.stream_bandwidth;
          optimizer[r] = k.optimizer_rate;
          if (rank == 0) kernels.optimizer_params = k.optimizer_params;
        },
        SpawnOptions{.threads_per_rank = threads});
    // Medians over the ranks; the peak is the time-averaged 1024^3 rate while every rank
    // computes (a best-of figure would follow the host's fastest moments, not a training step's).
    best_peak = median(best);
    peak = median(typical);
    kernels.linear_share = median(linear_share);
    kernels.small_linear_share = median(small_share);
    kernels.attention_share = median(attention_share);
    kernels.small_attention_share = median(small_attention_share);
    kernels.stream_bandwidth = median(stream);
    kernels.optimizer_rate = median(optimizer);
  }
  // eff(d) = E * d / (d + half) through the two linears, d their harmonic gemm_size (a CPU's
  // GEMMs are bound by operand traffic, not by tiles): half from the two (half_dim), then E from
  // the large one. Where E tops 1 — the [2048, 1024] linear outran the 1024^3 sgemm of the peak
  // round, as with one or two threads a rank on an AVX-512 host (E 1.11-1.12 with four ranks on
  // two cores, 1.22-1.25 with one rank of two threads) — the peak is raised to the curve's top
  // (lift) and every share is taken against it, so that the curve still passes through both
  // linears: cut at 1 instead, it ran 10-20% below them at every size.
  plan::Calibration harmonic;
  harmonic.gemm_size = "harmonic";
  const double d1 = plan::gemm_size(harmonic, 2048, 1024, 1024), d2 = plan::gemm_size(harmonic, 2048, 256, 256);
  const EfficiencyCurve curve = fit_efficiency_curve(kernels.linear_share, kernels.small_linear_share, d1, d2);
  const double half = curve.half_dim, lift = curve.lift, gemm_eff = curve.efficiency;
  const double top = lift * gemm_eff;  // E against the sgemm rate, before the lift
  // The attention kernel's own curve, the same way from its shares at T = 128 and 32.
  const double a1 = 128, a2 = 32;
  const double attention_half = half_dim(kernels.attention_share, kernels.small_attention_share, a1, a2);

  progress("measuring memcpy bandwidth (one thread, 256 MiB)...");
  const double copied = measure_memcpy_bandwidth();
  progress(fmt::format("measuring all_reduce on the thread backend ({} ranks)...", std::max(2, ranks)).c_str());
  CommFigures comm = measure_thread_all_reduce(ranks);
  progress("measuring op dispatch overhead...");
  const double overhead = measure_op_overhead();

  plan::Cluster c;
  c.name = "local";
  c.nodes = 1;
  c.devices_per_node = ranks;
  c.cores_per_node = m.cores;
  c.dtype = "f32";
  c.device.name = m.cpu_model.empty() ? "cpu" : m.cpu_model;
  c.device.peak_flops = {{"f32", sig4(peak * lift)}};
  c.device.memory_bytes = m.memory_bytes / ranks;
  // Streaming kernels: the rate a layer's elementwise ops reach, measured while every rank
  // computes (see measure_kernels). A lone memcpy is no floor for it: it runs with the other
  // cores idle, and GELU's tanh is bound by arithmetic, not bytes.
  c.device.memory_bandwidth = sig4(kernels.stream_bandwidth);
  c.intra = plan::Link{"shm", sig4(comm.busbw), sig4(comm.latency)};
  c.inter = plan::Link{"loopback", c.intra.bandwidth, c.intra.latency};
  c.nics_per_node = 0;
  plan::Calibration& k = c.calibration;
  // The stack is tessel itself: its profile with what is measured here (attention, dispatch).
  plan::SoftwareProfile& sw = c.software;
  sw = plan::software_profile("tessel-cpu");
  k.gemm_efficiency = sig4(gemm_eff);
  // The kernel's share at T = 128 over what its curve gives a GEMM there: over 1 where the causal
  // kernel, skipping masked blocks, beats a GEMM on the full count of FLOPs (the cluster form
  // allows up to 4 with a half-dim of its own).
  sw.attention_half_dim = sig4(attention_half);
  sw.attention_efficiency =
      sig4(std::clamp(kernels.attention_share / lift / (gemm_eff * a1 / (a1 + attention_half)), 0.01, 4.0));
  k.gemm_half_dim = sig4(half);
  k.gemm_size = harmonic.gemm_size;
  k.memory_efficiency = 1.0;
  k.link_efficiency = 1.0;
  sw.op_overhead = sig4(overhead);
  sw.optimizer_efficiency = sig4(std::clamp(kernels.optimizer_rate / kernels.stream_bandwidth, 0.05, 2.0));
  k.sources = {
      {"machine", fmt::format("hwloc: {}; {} ranks; {}; {}", m.str(), ranks, origin, devices_description())},
      {"peak_flops",
       fmt::format("time-averaged sgemm 1024^3 rate (tiled over the pool, as tessel runs it) with {} thread{} per rank "
                   "while {} rank{} compute{} (the rounds that time the kernels): {:.2f} GFLOP/s (best-of-shapes peak "
                   "{:.2f}){}; {}; {}",
                   threads, threads == 1 ? "" : "s", concurrent, concurrent == 1 ? "" : "s", concurrent == 1 ? "s" : "",
                   peak / 1e9, best_peak / 1e9,
                   lift > 1 ? fmt::format(", raised {:.1f}% to the top of tessel's linears' efficiency curve, which "
                                          "passes above it (see gemm_efficiency)",
                                          100 * (lift - 1))
                            : std::string(),
                   blas_kernels_description(), origin)},
      {"memory_bandwidth",
       fmt::format("a GPT-2 layer's elementwise ops (2 layer_norm and 2 add on [2048, 256], "
                   "tanh gelu on [2048, 1024]), forward and backward, charged 3x their forward "
                   "bytes as the cost model does, over their time with {} rank{} computing: "
                   "{:.2f} GB/s (for comparison, a lone single-thread memcpy of 256 MiB: {:.2f} "
                   "GB/s copied); {}",
                   concurrent, concurrent == 1 ? "" : "s", kernels.stream_bandwidth / 1e9, copied / 1e9, origin)},
      {"memory_bytes", fmt::format("total memory {} / {} ranks", bytes_text(m.memory_bytes), ranks)},
      {"intra", fmt::format("thread-backend all_reduce, {} ranks: busbw {:.2f} GB/s at 16 MiB, {:.1f} us at 4 bytes; "
                            "inter is the same (one node); {}",
                            std::max(2, ranks), comm.busbw / 1e9, comm.latency * 1e6, origin)},
      {"gemm_efficiency",
       fmt::format("tessel's linear forward and backward through autograd (3x the forward FLOPs) reaches {:.1f}% of "
                   "the sgemm 1024^3 rate on [2048, 1024] x [1024, 1024]^T and {:.1f}% on [2048, 256] x [256, 256]^T; "
                   "E * d / (d + half) through both at their sizes d (harmonic means of m, n, k) {:.0f} and {:.0f} "
                   "tops out at {:.3f} of that rate{}; {}",
                   100 * kernels.linear_share, 100 * kernels.small_linear_share, d1, d2, top,
                   lift > 1 ? ", so peak_flops is that top and E is 1" : "", origin)},
      {"gemm_half_dim", "from the same two linears (see gemm_efficiency)"},
      {"gemm_size",
       "harmonic: with register-sized tiles a CPU GEMM's work beyond its FLOPs (packing, reading the "
       "operands, writing the result) grows with mk + kn + mn, so its efficiency follows the harmonic "
       "mean of m, n and k"},
      {"memory_efficiency", "1.0: memory_bandwidth is the measured streaming roof"},
      {"link_efficiency", "1.0: the link bandwidth is the measured all_reduce busbw"},
  };
  // The software's own figures, beside tessel-cpu's documented ones.
  const std::map<std::string, std::string> software_sources = {
      {"attention_efficiency",
       fmt::format("tessel's causal sdpa on [16, 4, 128, 64], forward and backward (3x the "
                   "forward FLOPs), with q, k and v strided views of one packed projection and "
                   "the output laid out again for the next linear, as GPT-2 runs it, reaches "
                   "{:.1f}% of the sgemm 1024^3 rate ({:.1f}% of peak_flops); this share of "
                   "gemm_efficiency * d / (d + attention_half_dim) at d = 128; {}",
                   100 * kernels.attention_share, 100 * kernels.attention_share / lift, origin)},
      {"attention_half_dim", fmt::format("from the same sdpa at T = 128 and at T = 32 ([64, 4, 32, 64], the blocks of "
                                         "a context-parallel ring over 128 tokens), which reaches {:.1f}% of the sgemm "
                                         "1024^3 rate: E * d / (d + half) through both; {}",
                                         100 * kernels.small_attention_share, origin)},
      {"op_overhead", fmt::format("median time of add() on two 4-element f32 tensors through the op dispatch, "
                                  "recorded for autograd: "
                                  "{:.2f} us; {}",
                                  overhead * 1e6, origin)},
      {"optimizer_efficiency",
       fmt::format("the optimizer step's kernels as the engine calls them (the global gradient norm, then AdamW with "
                   "the clipping coefficient) on {:.2f}M parameters of four GPT-2 layers of width 256, a 1024^3 sgemm "
                   "between steps, with {} rank{} computing: {:.2f} GB/s on the {} bytes per parameter the cost model "
                   "charges, this share of memory_bandwidth; {}",
                   static_cast<double>(kernels.optimizer_params) / 1e6, concurrent, concurrent == 1 ? "" : "s",
                   kernels.optimizer_rate / 1e9, plan::optimizer_step_bytes(plan::precision_for("f32")), origin)},
      {"fragmentation", "0: host memory (malloc), no caching allocator"},
      {"reserved_bytes", "0: no device context or communication buffers beyond the process"},
  };
  for (const auto& [key, text] : software_sources) sw.sources[key] = text;
  return c;
}

EfficiencyCurve fit_efficiency_curve(double share1, double share2, double d1, double d2) {
  EfficiencyCurve curve;
  curve.half_dim = half_dim(share1, share2, d1, d2);
  const double top = share1 * (d1 + curve.half_dim) / d1;
  curve.lift = std::max(1.0, top);
  curve.efficiency = std::clamp(top / curve.lift, 0.05, 1.0);
  return curve;
}

std::string local_cluster_yaml(const plan::Cluster& c) {
  std::string out = "# The `local` cluster: this machine as tessel cluster detect measured it.\n";
  if (auto it = c.calibration.sources.find("machine"); it != c.calibration.sources.end())
    out += "# " + it->second + "\n";
  out += fmt::format("# device = one thread rank: {} ranks on {} cores (compute share {:.2f} with all ranks)\n",
                     c.devices_per_node, c.cores_per_node, c.compute_share(c.devices_per_node));
  out += fmt::format("# sgemm peak {:.2f} GFLOP/s; memory {:.2f} GB/s (read+write); all_reduce busbw {:.2f} GB/s, "
                     "latency {:.1f} us; {:.2f} us per op\n",
                     c.peak() / 1e9, c.device.memory_bandwidth / 1e9, c.intra.bandwidth / 1e9, c.intra.latency * 1e6,
                     c.software.op_overhead * 1e6);
  return out + c.to_yaml();
}

}  // namespace tessel
