// launch_comm_worker: a real tessel rank for the launcher's heartbeat tests. Joins the world
// group (Gloo, with the launcher's timeout and heartbeat), writes its pid to DIR/<RANK>.pid,
// then runs one-float all_reduces inside the activity "comm_worker step loop" until
// --seconds have passed, and exits 0 (1 on a communication error, printed).
//
//   launch_comm_worker --pid-dir DIR [--seconds S]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "tessel/comm/heartbeat.h"
#include "tessel/comm/world.h"
#include "tessel/core/error.h"

int main(int argc, char** argv) {
  std::string pid_dir;
  double seconds = 30;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--pid-dir") pid_dir = argv[i + 1];
    else if (flag == "--seconds") seconds = std::atof(argv[i + 1]);
  }
  try {
    auto world = tessel::init_world({.backend = "gloo"});
    if (!pid_dir.empty()) {
      const std::string tmp = pid_dir + "/." + std::to_string(world->rank()) + ".tmp";
      if (FILE* f = std::fopen(tmp.c_str(), "w")) {
        std::fprintf(f, "%d\n", static_cast<int>(::getpid()));
        std::fclose(f);
        std::rename(tmp.c_str(), (pid_dir + "/" + std::to_string(world->rank()) + ".pid").c_str());
      }
    }
    tessel::Activity loop("comm_worker step loop");
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < until) {
      float x = 1;
      world->all_reduce(&x, 1, tessel::DType::f32, tessel::ReduceOp::sum);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::printf("rank %d done\n", world->rank());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
