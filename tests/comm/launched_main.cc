// A program for `tessel launch`: each process is a Gloo rank.
//   comm_launched conformance        run the conformance suite on the world group
//   comm_launched conformance-nodes K [cyclic]
//                                    the same on an emulated topology: TESSEL_NODE is set to
//                                    RANK / K (K ranks per node, numbered node by node), or
//                                    with `cyclic` to RANK % K (K nodes, ranks dealt round)
//   comm_launched never-join R       rank R stays alive but skips a collective; the others
//                                    must fail with CommError naming R within the timeout
//   comm_launched killed R           ranks of one node (shared memory): after one all_reduce
//                                    rank R SIGKILLs itself; the others' next all_reduce must
//                                    fail within 10 s naming R's process (far before the timeout)
// Exit status 0 when the expectation held. TESSEL_COMM_TIMEOUT_MS sets the group timeout.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "conformance.h"
#include "tessel/comm/gloo_backend.h"
#include "tessel/comm/world.h"
#include "tessel/core/error.h"

using namespace tessel;

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "conformance";
  const char* t = std::getenv("TESSEL_COMM_TIMEOUT_MS");
  Millis timeout = t ? Millis(std::atoi(t)) : Millis(60'000);
  if (mode == "conformance-nodes" && argc > 2) {
    const int k = std::atoi(argv[2]), rank = std::atoi(std::getenv("RANK") ? std::getenv("RANK") : "0");
    const bool cyclic = argc > 3 && std::string(argv[3]) == "cyclic";
    ::setenv("TESSEL_NODE", std::to_string(cyclic ? rank % k : rank / k).c_str(), 1);
    mode = "conformance";
  }
  try {
    auto g = init_world({.backend = "gloo", .timeout = timeout});
    if (mode == "conformance") {
      testing::run_conformance(*g);
      std::printf("rank %d of %d (node %d%s): conformance ok\n", g->rank(), g->size(), g->nodes()[static_cast<size_t>(g->rank())],
                  g->all_to_all_hierarchical() ? ", hierarchical all_to_all" : "");
      return 0;
    }
    if (mode == "never-join" && argc > 2) {
      int skip = std::atoi(argv[2]);
      if (g->rank() == skip) {
        std::this_thread::sleep_for(timeout * 4);  // alive, never joins
        return 0;
      }
      float x = 1;
      auto t0 = std::chrono::steady_clock::now();
      try {
        g->all_reduce(&x, 1, DType::f32, ReduceOp::sum);
      } catch (const CommError& e) {
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::string msg = e.what();
        bool named = msg.find(fmt::format("[{}]", skip)) != std::string::npos;
        std::printf("rank %d: CommError after %.2f s (%s): %s\n", g->rank(), s, named ? "names the rank" : "MISSING NAME",
                    msg.c_str());
        return named && s < timeout.count() / 1000.0 + 5 ? 0 : 1;
      }
      std::printf("rank %d: the collective completed without rank %d\n", g->rank(), skip);
      return 1;
    }
    if (mode == "killed" && argc > 2) {
      const int killed = std::atoi(argv[2]);
      std::vector<float> x(1 << 12, 1.0f);
      g->all_reduce(x.data(), static_cast<int64_t>(x.size()), DType::f32, ReduceOp::sum);
      if (gloo_transport_in_use(*g) != "shm") {
        std::printf("rank %d: the group uses %s, not shared memory\n", g->rank(), gloo_transport_in_use(*g).c_str());
        return 1;
      }
      if (g->rank() == killed) ::raise(SIGKILL);
      const auto t0 = std::chrono::steady_clock::now();
      try {
        g->all_reduce(x.data(), static_cast<int64_t>(x.size()), DType::f32, ReduceOp::sum);
      } catch (const CommError& e) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const std::string msg = e.what();
        const bool named = msg.find(fmt::format("group rank {}'s process", killed)) != std::string::npos &&
                           msg.find(fmt::format("missing world ranks [{}]", killed)) != std::string::npos;
        std::printf("rank %d: CommError after %.2f s (%s): %s\n", g->rank(), s, named ? "names the rank" : "MISSING NAME",
                    msg.c_str());
        return named && s < 10 ? 0 : 1;
      }
      std::printf("rank %d: the collective completed without rank %d\n", g->rank(), killed);
      return 1;
    }
    std::fprintf(stderr, "usage: comm_launched conformance | never-join RANK | killed RANK\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
