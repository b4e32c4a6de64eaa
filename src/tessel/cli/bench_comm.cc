// Collective benchmarks in the style of nccl-tests.
#include "tessel/cli/bench_comm.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <thread>
#include <vector>

#include "tessel/comm/gloo_backend.h"
#include "tessel/comm/thread_backend.h"
#include "tessel/comm/world.h"
#include "tessel/core/context.h"
#include "tessel/core/error.h"

namespace tessel {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// nccl-tests' bus bandwidth factor: what each rank's links carry relative to the algorithm
// bandwidth, so results compare across rank counts.
double bus_factor(const std::string& op, int n) {
  if (n <= 1) return op == "send_recv" ? 1.0 : 0.0;
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all") return static_cast<double>(n - 1) / n;
  return 1.0;  // broadcast, send_recv
}

// One size: `size` is nccl-tests' column (the all_gather output, the reduce_scatter input,
// the buffer otherwise). Returns seconds per iteration on this rank.
struct Row {
  int64_t size, count;
  double seconds, direct_seconds = 0, classic_seconds = 0, hierarchical_seconds = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// all_to_all on a group over several nodes: flat and hierarchical in alternating blocks of
// iterations (each between barriers), five blocks each, the median block compared — drifting
// machine or link noise hits both alike.
Row compare_all_to_all(ProcessGroup& g, Row row, const std::function<void()>& once,
                       const std::function<double(const std::function<void()>&, int)>& timed, int iters) {
  const AllToAllAlgorithm before = g.all_to_all_algorithm();
  constexpr int kBlocks = 5;
  const int per = std::max(1, iters / kBlocks);
  std::vector<double> flat, hier;
  g.set_all_to_all_algorithm(AllToAllAlgorithm::hierarchical);
  once();  // warm up the sub-groups' connections
  for (int b = 0; b < kBlocks; ++b) {
    g.set_all_to_all_algorithm(AllToAllAlgorithm::flat);
    flat.push_back(timed(once, per));
    g.set_all_to_all_algorithm(AllToAllAlgorithm::hierarchical);
    hier.push_back(timed(once, per));
  }
  g.set_all_to_all_algorithm(before);
  row.seconds = median(flat);
  row.hierarchical_seconds = median(hier);
  return row;
}

Row measure(ProcessGroup& g, const std::string& op, int64_t size, int iterations) {
  const int n = g.size(), me = g.rank();
  const bool per_rank = op == "all_gather" || op == "reduce_scatter" || op == "all_to_all";
  int64_t count = size / 4 / (per_rank ? n : 1);
  count = std::max<int64_t>(count, 1);
  std::vector<float> in(static_cast<size_t>(count * (per_rank ? n : 1)), 1.0f);
  std::vector<float> out(in.size(), 0.0f);
  auto once = [&] {
    if (op == "all_reduce") g.all_reduce(in.data(), count, DType::f32, ReduceOp::sum);
    else if (op == "all_gather") g.all_gather(in.data(), out.data(), count, DType::f32);
    else if (op == "reduce_scatter") g.reduce_scatter(in.data(), out.data(), count, DType::f32, ReduceOp::sum);
    else if (op == "all_to_all") g.all_to_all(in.data(), out.data(), count, DType::f32);
    else if (op == "broadcast") g.broadcast(in.data(), count, DType::f32, 0);
    else if (op == "send_recv") {
      if (n == 1) return;
      auto r = g.recv_async(out.data(), count, DType::f32, (me + n - 1) % n, 0);
      auto s = g.send_async(in.data(), count, DType::f32, (me + 1) % n, 0);
      s->wait();
      r->wait();
    }
  };
  auto timed = [&](const std::function<void()>& f, int iters) {
    g.barrier();
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) f();
    g.barrier();
    return seconds_since(t0) / iters;
  };
  const bool compare_a2a = op == "all_to_all" && g.hierarchical();
  if (compare_a2a) g.set_all_to_all_algorithm(AllToAllAlgorithm::flat);  // the adaptive count from the flat form
  once();  // warm up (connections, allocations)
  int iters = iterations;
  if (iters <= 0) {
    double t1 = timed(once, 1);
    int64_t want = static_cast<int64_t>(std::clamp(0.2 / std::max(t1, 1e-7), 3.0, 2000.0));
    g.broadcast(&want, 1, DType::i64, 0);  // every rank runs the same number of iterations
    iters = static_cast<int>(want);
  }
  if (compare_a2a) return compare_all_to_all(g, Row{size, count, 0}, once, timed, iters);
  if (op != "all_reduce" || g.backend() != "gloo") return Row{size, count, timed(once, iters)};
  // Against Gloo called directly: the three are timed one after another within every
  // iteration, each between barriers, and the medians compared, so drifting machine noise
  // hits all three alike.
  auto direct = [&] { gloo_direct_ring_all_reduce(g, in.data(), count, false); };
  auto classic = [&] { gloo_direct_ring_all_reduce(g, in.data(), count, true); };
  direct();
  classic();
  std::vector<double> a, b, c;
  for (int i = 0; i < iters; ++i) {
    a.push_back(timed(once, 1));
    b.push_back(timed(direct, 1));
    c.push_back(timed(classic, 1));
  }
  Row row{size, count, median(a)};
  row.direct_seconds = median(b);
  row.classic_seconds = median(c);
  return row;
}

void body(ProcessGroup& g, const CommBenchOptions& o, const std::string& how) {
  const int n = g.size();
  double memcpy_bw = 0;
  // At least 64 MiB, past the caches, so the reference is the memory's bandwidth.
  if (g.rank() == 0) memcpy_bw = measure_memcpy_bandwidth(std::clamp<int64_t>(o.max_bytes, 64 << 20, 256 << 20)) / 1e9;
  g.barrier();
  bool gloo = g.backend() == "gloo" && o.op == "all_reduce";
  const bool hier = o.op == "all_to_all" && g.hierarchical();
  if (g.rank() == 0) {
    std::set<int> nodes(g.nodes().begin(), g.nodes().end());
    std::printf("# tessel bench comm: %s, %d ranks (%s), float32, %s\n", o.op.c_str(), n, how.c_str(),
                o.op == "send_recv" ? "ring of send/recv" : "sum where it reduces");
    std::printf("# nodes: %zu (node of each rank: %s)%s\n", nodes.size(), fmt::format("{}", fmt::join(g.nodes(), " ")).c_str(),
                hier ? "; flat and hierarchical all_to_all timed in alternating blocks, medians" : "");
    std::printf("# memcpy bandwidth on this machine, same run: %.2f GB/s (bytes copied per second)\n", memcpy_bw);
    std::printf("#%11s %12s %6s %11s %9s %9s %8s%s%s\n", "size (B)", "count", "type", "time (us)", "algbw", "busbw",
                "bus/mcpy", gloo ? "  gloo::allreduce (us)  ratio  AllreduceRing (us)  ratio" : "",
                hier ? "  | hierarchical: time (us)     algbw     busbw  bus/mcpy  flat/hier" : "");
  }
  for (int64_t size = o.min_bytes; size <= o.max_bytes; size *= 2) {
    Row r = measure(g, o.op, size, o.iterations);
    if (g.rank() != 0) continue;
    double algbw = static_cast<double>(size) / r.seconds / 1e9, busbw = algbw * bus_factor(o.op, n);
    std::printf("%12lld %12lld %6s %11.1f %9.3f %9.3f %7.0f%%", static_cast<long long>(size),
                static_cast<long long>(r.count), "float", r.seconds * 1e6, algbw, busbw, 100 * busbw / memcpy_bw);
    if (gloo)
      std::printf("  %20.1f %5.2fx %19.1f %5.2fx", r.direct_seconds * 1e6, r.direct_seconds / r.seconds,
                  r.classic_seconds * 1e6, r.classic_seconds / r.seconds);
    if (hier) {
      double h_algbw = static_cast<double>(size) / r.hierarchical_seconds / 1e9, h_busbw = h_algbw * bus_factor(o.op, n);
      std::printf("  | %23.1f %9.3f %9.3f %8.0f%% %9.2fx", r.hierarchical_seconds * 1e6, h_algbw, h_busbw,
                  100 * h_busbw / memcpy_bw, r.seconds / r.hierarchical_seconds);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  if (g.rank() == 0 && hier)
    std::printf("# flat/hier: the flat all_to_all's time over the hierarchical one's; above 1 the hierarchical is "
                "faster\n");
  if (g.rank() == 0 && gloo)
    std::printf("# ratio: Gloo's own ring all_reduce time (called directly, no tessel code) over tessel's; 1.00x is "
                "the same speed, above 1 tessel is faster\n");
}

}  // namespace

double measure_memcpy_bandwidth(int64_t bytes) {
  const size_t n = static_cast<size_t>(bytes);
  std::vector<char> a(n, 1), b(n, 2);
  std::vector<double> t;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), n);
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return static_cast<double>(bytes) / t[2];
}

int run_comm_bench(const CommBenchOptions& o) {
  static const char* kOps[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"};
  TESSEL_CHECK(std::find_if(std::begin(kOps), std::end(kOps), [&](const char* k) { return o.op == k; }) != std::end(kOps),
               "--op {}: expected all_reduce, all_gather, reduce_scatter, all_to_all, broadcast or send_recv", o.op);
  TESSEL_CHECK(o.min_bytes >= 4 && o.min_bytes <= o.max_bytes, "--min {} and --max {}: need 4 <= min <= max", o.min_bytes,
               o.max_bytes);
  TESSEL_CHECK(o.backend == "thread" || o.backend == "gloo", "--backend {}: expected thread or gloo", o.backend);
  bool launched = std::getenv("RANK") != nullptr;
  if (launched) {
    auto g = init_world({.backend = "gloo"});
    body(*g, o, "gloo, one process per rank");
    return 0;
  }
  TESSEL_CHECK(o.np >= 1, "--np {}: need at least one rank", o.np);
  TESSEL_CHECK(o.ranks_per_node >= 0, "--ranks-per-node {}: need a non-negative count", o.ranks_per_node);
  std::vector<int> nodes;  // emulated nodes: ranks numbered node by node
  if (o.ranks_per_node > 0)
    for (int r = 0; r < o.np; ++r) nodes.push_back(r / o.ranks_per_node);
  if (o.backend == "thread") {
    SpawnOptions so;
    so.nodes = nodes;
    spawn(o.np, [&](int) { body(*world_group(), o, "thread backend, ranks are threads"); }, so);
    return 0;
  }
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::thread> threads;
  std::exception_ptr error;
  std::mutex m;
  for (int r = 0; r < o.np; ++r)
    threads.emplace_back([&, r] {
      auto ctx = make_rank_context(r, o.np, 1);
      RankContextScope scope(ctx);
      try {
        auto g = make_gloo_group(store, r, o.np, nodes, "127.0.0.1", kDefaultTimeout);
        body(*g, o, "gloo over loopback, ranks are threads; use `tessel launch` for processes");
      } catch (...) {
        std::lock_guard lock(m);
        if (!error) error = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  return 0;
}

}  // namespace tessel
