// What tensor-parallel synchronisation costs thread ranks that share cores. Every rank runs
// `--steps` rounds of an sgemm the size of a layer's linear followed by an all_reduce of its
// output within its group of `--group` ranks (ranks 0..g-1, g..2g-1, ...), as a tensor-parallel
// layer does; the reference is the same rounds without the all_reduce, measured alternately
// in the same run. The figure is the sync efficiency: the reference's time over the synced
// one (1.0: synchronising costs nothing beyond the reduction's own work), median of rounds.
//
// --elems N all-reduces only the output's first N floats, which leaves the synchronisation with
// little work of its own.
//
//   build/release/bench/sync_bench [--ranks 8] [--group 2] [--dim 256] [--steps 64] [--rounds 9] [--elems N]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "tessel/comm/thread_backend.h"
#include "tessel/comm/world.h"

using namespace tessel;

namespace {

using Clock = std::chrono::steady_clock;

using tessel::bench::median;

struct Options {
  int ranks = 8, group = 2, dim = 256, steps = 64, rounds = 9;
  int elems = 0;  // floats all-reduced; 0: the whole output
};

// Seconds of `steps` rounds on this rank: [4·dim, dim] x [dim, dim] then, when `sync`, an
// all_reduce of the [4·dim, dim] output in `g`. Every rank starts together (world barrier).
double run(const Options& o, ProcessGroup& world, ProcessGroup& g, bool sync, std::vector<float>& a,
           std::vector<float>& b, std::vector<float>& c) {
  const int m = 4 * o.dim, n = o.dim;
  world.barrier();
  auto t0 = Clock::now();
  for (int s = 0; s < o.steps; ++s) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    if (sync) g.all_reduce(c.data(), o.elems > 0 ? std::min<int64_t>(o.elems, m * n) : m * n, DType::f32, ReduceOp::sum);
  }
  world.barrier();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    auto value = [&](int& out) {
      if (i + 1 >= argc) return false;
      out = std::atoi(argv[++i]);
      return true;
    };
    bool ok = false;
    if (std::strcmp(argv[i], "--ranks") == 0) ok = value(o.ranks);
    else if (std::strcmp(argv[i], "--group") == 0) ok = value(o.group);
    else if (std::strcmp(argv[i], "--dim") == 0) ok = value(o.dim);
    else if (std::strcmp(argv[i], "--steps") == 0) ok = value(o.steps);
    else if (std::strcmp(argv[i], "--rounds") == 0) ok = value(o.rounds);
    else if (std::strcmp(argv[i], "--elems") == 0) ok = value(o.elems);
    if (!ok) {
      std::printf("usage: sync_bench [--ranks 8] [--group 2] [--dim 256] [--steps 64] [--rounds 9] [--elems N]\n"
                  "Sync efficiency of thread ranks: sgemm + all_reduce in groups vs sgemm alone, paired rounds.\n");
      return std::strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  if (o.ranks < 1 || o.group < 1 || o.ranks % o.group != 0 || o.dim < 1 || o.elems < 0 || o.steps < 1 || o.rounds < 1) {
    std::fprintf(stderr, "sync_bench: need positive values and --group dividing --ranks (got --ranks %d --group %d)\n",
                 o.ranks, o.group);
    return 2;
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (int rc = parse(argc, argv, o); rc >= 0) return rc;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::printf("%d thread ranks on %u cores, all_reduce in groups of %d after each [%d, %d] x [%d, %d] sgemm, "
              "%d steps per round, median of %d rounds\n",
              o.ranks, cores, o.group, 4 * o.dim, o.dim, o.dim, o.dim, o.steps, o.rounds);
  std::vector<double> plain(static_cast<size_t>(o.rounds)), synced(plain.size());
  spawn(
      o.ranks,
      [&](int rank) {
        ProcessGroup& world = *world_group();
        std::vector<std::vector<int>> sets;
        for (int first = 0; first < o.ranks; first += o.group) {
          sets.emplace_back();
          for (int r = first; r < first + o.group; ++r) sets.back().push_back(r);
        }
        std::shared_ptr<ProcessGroup> g = world.split(sets);
        const size_t n = static_cast<size_t>(o.dim);
        std::vector<float> a(4 * n * n, 0.5f), b(n * n, 0.25f), c(4 * n * n);
        run(o, world, *g, true, a, b, c);  // warm up
        for (int r = 0; r < o.rounds; ++r) {
          // Alternate which goes first so drift affects both alike.
          double p, s;
          if (r % 2 == 0) {
            p = run(o, world, *g, false, a, b, c);
            s = run(o, world, *g, true, a, b, c);
          } else {
            s = run(o, world, *g, true, a, b, c);
            p = run(o, world, *g, false, a, b, c);
          }
          if (rank == 0) plain[static_cast<size_t>(r)] = p, synced[static_cast<size_t>(r)] = s;
        }
      },
      SpawnOptions{.threads_per_rank = 1});
  std::vector<double> eff, extra;
  for (size_t r = 0; r < plain.size(); ++r) {
    eff.push_back(plain[r] / synced[r]);
    extra.push_back((synced[r] - plain[r]) / o.steps);
  }
  std::printf("sgemm only %.4f s, with all_reduce %.4f s per round (medians)\n", median(plain), median(synced));
  std::printf("sync efficiency %.3f (range %.3f-%.3f); extra per all_reduce %.1f us\n", median(eff),
              *std::min_element(eff.begin(), eff.end()), *std::max_element(eff.begin(), eff.end()),
              median(extra) * 1e6);
}
