// Overhead of eager distributed dispatch: the same tiny op on plain tensors and on distributed
// tensors whose placements need no communication (rule + bookkeeping only), with and without
// autograd recording. The host is noisy, so plain and distributed blocks are interleaved
// (paired) and the overhead is the median over rounds of (distributed − plain) per op.
//
//   build/release/bench/dist_bench [--rounds 31] [--iters 2000]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "tessel/comm/thread_backend.h"
#include "tessel/comm/world.h"
#include "tessel/core/context.h"
#include "tessel/dist/dtensor.h"
#include "tessel/ops/ops.h"

using namespace tessel;

namespace {

enum class Op { add, linear, gelu };

Tensor run(Op op, const Tensor& a, const Tensor& b) {
  switch (op) {
    case Op::add: return add(a, b);
    case Op::linear: return linear(a, b);
    case Op::gelu: return gelu(a, true);
  }
  return {};
}

struct Inputs {
  Tensor x, w;
};

// Plain 4x4 tensors, or distributed on a mesh of `ranks` (x S(0); the weight S(0) for add and
// R otherwise: no reshard is needed).
Inputs make_inputs(Op op, int ranks, bool grad) {
  Inputs in{Tensor::ones({4, 4}), Tensor::ones({4, 4})};
  if (ranks > 0) {
    ProcessMesh mesh = ProcessMesh::iota({ranks});
    in.x = shard_tensor(in.x, mesh, {Shard(0)});
    in.w = shard_tensor(in.w, mesh, {op == Op::add ? Shard(0) : Replicate()});
  }
  in.x.set_requires_grad(grad);
  in.w.set_requires_grad(grad);
  return in;
}

// Nanoseconds per op over `iters` calls.
double time_block(Op op, const Inputs& in, int iters) {
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    Tensor y = run(op, in.x, in.w);
    if (!y.defined()) std::abort();
  }
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / iters;
}

using tessel::bench::median;

void measure(int rounds, int iters) {
  std::printf("%-7s %-8s %-6s %10s %12s %12s\n", "op", "autograd", "ranks", "plain ns", "distributed", "overhead ns");
  for (auto [op, name] : {std::pair{Op::add, "add"}, std::pair{Op::linear, "linear"}, std::pair{Op::gelu, "gelu"}})
    for (bool grad : {false, true})
      for (int ranks : {1, 2}) {
        GradModeGuard mode(grad);
        Inputs plain = make_inputs(op, 0, grad), dist = make_inputs(op, ranks, grad);
        time_block(op, plain, iters);  // warm up both
        time_block(op, dist, iters);
        std::vector<double> p, d, diff;
        for (int r = 0; r < rounds; ++r) {
          // Alternate which goes first so drift affects both alike.
          double a, b;
          if (r % 2 == 0) {
            a = time_block(op, plain, iters);
            b = time_block(op, dist, iters);
          } else {
            b = time_block(op, dist, iters);
            a = time_block(op, plain, iters);
          }
          p.push_back(a);
          d.push_back(b);
          diff.push_back(b - a);
        }
        std::printf("%-7s %-8s %-6d %10.0f %12.0f %12.0f\n", name, grad ? "grad" : "no_grad", ranks, median(p), median(d),
                    median(diff));
        std::fflush(stdout);
      }
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 31, iters = 2000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) iters = std::atoi(argv[++i]);
    else {
      std::printf("usage: dist_bench [--rounds N] [--iters N]\n"
                  "Per-op overhead of eager distributed dispatch (no communication), median of paired rounds.\n");
      return std::strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  if (rounds < 1 || iters < 1) {
    std::fprintf(stderr, "dist_bench: --rounds and --iters must be positive\n");
    return 2;
  }
  set_default_num_threads(1);
  std::printf("eager distributed dispatch overhead, 4x4 f32, 1 thread, median of %d paired rounds x %d calls\n", rounds,
              iters);
  // No communication is involved, so the other ranks need not take part: rank 0 times alone.
  spawn(2, [&](int rank) {
    if (rank == 0) measure(rounds, iters);
  });
}
