// Reshards of one activation [b, s, h] between two thread ranks, the moves tensor and sequence
// parallelism make every layer: Partial -> Replicate (the row-parallel output without sp),
// S(1) -> R and P -> S(1) (the sequence-parallel gather and scatter), S(2) -> R (GPT-2's packed
// QKV gathered over features) and S(0) -> R (the outermost dim: one contiguous block per rank).
// The piece is rewritten before each reshard, as the op producing it would have just done.
// Each is timed beside a single-thread memcpy of the whole tensor measured in the same run,
// interleaved round by round; the figures are medians over rounds.
//
//   build/release/bench/reshard_bench [--rounds 31] [--shape 16,128,256]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "tessel/comm/thread_backend.h"
#include "tessel/comm/world.h"
#include "tessel/core/error.h"
#include "tessel/core/view.h"
#include "tessel/dist/dtensor.h"

using namespace tessel;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Case {
  const char* name;
  Placements from, to;
};

void measure(const Shape& shape, int rounds) {
  const std::vector<Case> cases = {{"P -> R (all_reduce)", {Partial()}, {Replicate()}},
                                   {"S(1) -> R (sp gather)", {Shard(1)}, {Replicate()}},
                                   {"P -> S(1) (sp scatter)", {Partial()}, {Shard(1)}},
                                   {"S(2) -> R (features)", {Shard(2)}, {Replicate()}},
                                   {"S(0) -> R (outermost)", {Shard(0)}, {Replicate()}}};
  const Tensor full = Tensor::ones(shape);
  const size_t bytes = static_cast<size_t>(full.numel()) * sizeof(float);
  std::vector<char> src(bytes, 1), dst(bytes);
  std::vector<std::vector<double>> times(cases.size()), copies(cases.size());
  spawn(2, [&](int rank) {
    const ProcessMesh mesh = ProcessMesh::iota({2});
    auto world = world_group();
    auto run_case = [&](size_t c, int reps, bool timed) {
      const Tensor x = shard_tensor(full, mesh, cases[c].from);
      for (int r = 0; r < reps; ++r) {
        view::fill(local_piece(x), rank == 0 ? 1.0 : 0.0);  // freshly written, as by the op producing it
        world->barrier();
        const auto t0 = Clock::now();
        Tensor y = reshard(x, mesh, cases[c].to);
        const double t = seconds_since(t0);
        world->barrier();
        if (rank != 0 || !timed) continue;
        times[c].push_back(t);
        const auto t1 = Clock::now();  // the other rank waits at the barrier meanwhile
        std::memcpy(dst.data(), src.data(), bytes);
        copies[c].push_back(seconds_since(t1));
        if (!y.defined()) std::abort();
      }
    };
    // A first pass over every case warms up (allocator, caches, the reshard plans).
    for (size_t c = 0; c < cases.size(); ++c) run_case(c, 3, false);
    for (size_t c = 0; c < cases.size(); ++c) run_case(c, rounds, true);
  });
  std::printf("reshard of f32 [%lld, %lld, %lld] (%.2f MiB) on 2 thread ranks; medians of %d rounds\n",
              static_cast<long long>(shape[0]), static_cast<long long>(shape[1]), static_cast<long long>(shape[2]),
              static_cast<double>(bytes) / (1 << 20), rounds);
  std::printf("%-24s %12s %14s %10s\n", "move", "time (us)", "memcpy (us)", "x memcpy");
  for (size_t c = 0; c < cases.size(); ++c) {
    const double t = bench::median(times[c]), m = bench::median(copies[c]);
    std::printf("%-24s %12.1f %14.1f %9.2fx\n", cases[c].name, t * 1e6, m * 1e6, t / m);
  }
}

// b, s, h from "16,128,256"; exits 2 naming the problem.
Shape activation_shape(const std::string& text) {
  Shape s;
  try {
    s = parse_shape(text);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: --shape: %s\n", e.what());
    std::exit(2);
  }
  if (s.size() != 3 || s[0] < 2 || s[1] < 2 || s[2] < 2) {
    std::fprintf(stderr, "error: --shape takes three sizes (b, s, h) of at least 2, e.g. 16,128,256; got '%s'\n",
                 text.c_str());
    std::exit(2);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 31;
  Shape shape{16, 128, 256};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (a == "--shape" && i + 1 < argc) {
      shape = activation_shape(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: reshard_bench [--rounds N] [--shape B,S,H]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  if (rounds < 1) {
    std::fprintf(stderr, "error: --rounds must be at least 1\n");
    return 2;
  }
  measure(shape, rounds);
  return 0;
}
