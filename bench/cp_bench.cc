// Context-parallel scaling on this machine's cores: one causal attention forward+backward of a
// GPT-2-tiny-width layer (B 1, H 4, D 64) at each sequence length, on cp = 1 rank (one core) and
// on cp = 2 thread ranks (one core each) by ring attention and by all_to_all. The figure is
// tokens/s per rank — the sequence's tokens over cp over the step's seconds: equal to cp = 1's
// is linear scaling (the causal load balance gives both ring ranks the same work). Both wall
// seconds and the rank thread's CPU seconds are given: on a machine whose cores other work
// shares, the CPU figure is the one that says what a rank's share of the work cost. For the
// ring, the share of its transfer time hidden behind compute: 1 - (the seconds the ranks
// waited for their blocks after computing, from the ring's own timing record,
// ring_attention_stats) / (the seconds the same transfers take alone, measured on the same
// ranks in the same run: send/recv of the same bytes around the ring with nothing else).
//
//   build/release/bench/cp_bench [--seqs 4096,32768] [--reps 3]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "tessel/autograd/engine.h"
#include "tessel/comm/thread_backend.h"
#include "tessel/comm/world.h"
#include "tessel/core/philox.h"
#include "tessel/core/view.h"
#include "tessel/dist/dtensor.h"
#include "tessel/dist/mesh_comm.h"
#include "tessel/dist/ring_attention.h"
#include "tessel/ops/ops.h"

using namespace tessel;

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kB = 1, kH = 4, kD = 64;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

Tensor random(const Shape& s, uint64_t stream) {
  Tensor t = Tensor::empty(s, DType::f32);
  rng_fill(t, Distribution::normal, 0, 1, 3, stream);
  return t;
}

struct Result {
  double seconds = 0, cpu_s = 0, wait_s = 0, alone_s = 0;
};

// Seconds of one forward+backward (median of reps) on `cp` thread ranks; the ring's waits and
// the transfers alone, rank 0's.
Result run(int64_t T, int cp, const char* method, int reps) {
  Result out;
  SpawnOptions options;
  options.threads_per_rank = 1;
  spawn(cp, [&](int rank) {
    // The ranks' pieces made here: the order does not change the work (the ring's chunks are
    // as balanced for random values as for a loader's permutation).
    Tensor q = random({kB, kH, T, kD}, 1), k = random({kB, kH, T, kD}, 2), v = random({kB, kH, T, kD}, 3);
    Tensor dy = random({kB, kH, T, kD}, 4);
    std::vector<double> times, cpu;
    ring_attention_stats() = RingAttentionStats{};
    for (int r = 0; r < reps; ++r) {
      Tensor lq, lk, lv, g;
      if (cp > 1) {
        const ProcessMesh mesh = ProcessMesh::iota({cp}, {"cp"});
        lq = shard_tensor(q, mesh, {Shard(2)});
        lk = shard_tensor(k, mesh, {Shard(2)});
        lv = shard_tensor(v, mesh, {Shard(2)});
      } else {
        lq = view::clone(q);
        lk = view::clone(k);
        lv = view::clone(v);
      }
      for (Tensor* t : {&lq, &lk, &lv}) t->set_requires_grad(true);
      world_group()->barrier();
      const auto t0 = Clock::now();
      const double c0 = thread_cpu_seconds();
      Tensor y = scaled_dot_product_attention(lq, lk, lv, Tensor(), true, 0.0, method);
      if (cp > 1) {
        g = shard_tensor(dy, dist_attr(y).mesh, dist_attr(y).placements);
      } else {
        g = dy;
      }
      backward(sum(mul(y, g)));
      cpu.push_back(thread_cpu_seconds() - c0);
      world_group()->barrier();
      times.push_back(seconds_since(t0));
    }
    const RingAttentionStats stats = ring_attention_stats();
    double alone = 0;
    if (cp > 1 && std::strcmp(method, "ring") == 0 && stats.transfers > 0) {
      // The same transfers with nothing to hide behind: each block's bytes to the next rank.
      auto group = world_group();
      const int64_t per = stats.bytes / stats.transfers / 4;
      std::vector<float> send(static_cast<size_t>(per), 1.0f), recv(static_cast<size_t>(per));
      group->barrier();
      const auto t0 = Clock::now();
      for (int64_t i = 0; i < stats.transfers; ++i) {
        auto s = group->send_async(send.data(), per, DType::f32, (rank + 1) % cp, 1);
        auto r = group->recv_async(recv.data(), per, DType::f32, (rank - 1 + cp) % cp, 1);
        s->wait();
        r->wait();
      }
      alone = seconds_since(t0);
    }
    if (rank == 0) {
      out.seconds = bench::median(times);
      out.cpu_s = bench::median(cpu);
      out.wait_s = stats.wait_s;
      out.alone_s = alone;
    }
  }, options);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> seqs = {4096, 32768};
  int reps = 3;
  const char* usage = "usage: cp_bench [--seqs 4096,32768] [--reps 3]\n";
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", usage);
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "cp_bench: %s needs a value\n%s", a.c_str(), usage);
      return 2;
    }
    if (a == "--seqs") {
      seqs.clear();
      for (const char* p = argv[i + 1]; *p != 0;) {
        seqs.push_back(std::strtoll(p, const_cast<char**>(&p), 10));
        if (*p == ',') ++p;
      }
    } else if (a == "--reps") {
      reps = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "cp_bench: unknown argument %s\n%s", a.c_str(), usage);
      return 2;
    }
  }
  std::printf("causal attention forward+backward, B %lld H %lld D %lld, f32, thread ranks of one core each\n",
              static_cast<long long>(kB), static_cast<long long>(kH), static_cast<long long>(kD));
  std::printf("%8s %4s %-11s %9s %14s %8s %9s %14s %8s %12s %10s %7s\n", "T", "cp", "method", "wall s",
              "tok/s/rank", "vs cp1", "cpu s", "tok/cpu-s/rank", "vs cp1", "ring wait s", "alone s", "hidden");
  for (int64_t T : seqs) {
    const int r = T >= 16384 ? 1 : reps;
    const Result one = run(T, 1, "ring", r);
    const double base = static_cast<double>(T) / one.seconds, base_cpu = static_cast<double>(T) / one.cpu_s;
    std::printf("%8lld %4d %-11s %9.3f %14.0f %8s %9.3f %14.0f %8s %12s %10s %7s\n", static_cast<long long>(T), 1, "-",
                one.seconds, base, "1.00", one.cpu_s, base_cpu, "1.00", "-", "-", "-");
    for (const char* method : {"ring", "all_to_all"}) {
      const Result two = run(T, 2, method, r);
      const double per_rank = static_cast<double>(T) / 2 / two.seconds;
      const double per_rank_cpu = static_cast<double>(T) / 2 / two.cpu_s;
      const bool ring = std::strcmp(method, "ring") == 0;
      const double hidden = ring && two.alone_s > 0 ? std::clamp(1.0 - two.wait_s / two.alone_s, 0.0, 1.0) : 0.0;
      std::printf("%8lld %4d %-11s %9.3f %14.0f %8.2f %9.3f %14.0f %8.2f %12s %10s %7s\n", static_cast<long long>(T), 2,
                  method, two.seconds, per_rank, per_rank / base, two.cpu_s, per_rank_cpu, per_rank_cpu / base_cpu,
                  ring ? fmt::format("{:.4f}", two.wait_s).c_str() : "-",
                  ring ? fmt::format("{:.4f}", two.alone_s).c_str() : "-",
                  ring ? fmt::format("{:.0f}%", 100 * hidden).c_str() : "-");
    }
  }
  return 0;
}
