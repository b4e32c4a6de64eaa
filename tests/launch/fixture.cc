// launch_fixture: a stand-in worker for the launcher tests (no tessel libraries).
//
//   --pid-dir DIR          write this process's pid to DIR/<RANK>.pid first
//   --print-env            print "env RANK=.. WORLD_SIZE=.. ..." on stdout
//   --stderr               print "stderr of rank R" on stderr
//   --partial              print "partial-R" without a trailing newline
//   --exit-rank R --exit-code C   rank R exits with code C (after every rank wrote its pid
//                          file, when --pid-dir is given, so tests know every pid)
//   --kill-rank R --signal S      rank R kills itself with signal S (same wait)
//   --ignore-term          ignore SIGTERM (the launcher must escalate to SIGKILL)
//   --grandchild           fork a child that sleeps in this process group (DIR/<R>.child.pid)
//   --sleep SECONDS        the other ranks sleep this long, then exit 0
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "<unset>";
}

void write_pid(const std::string& dir, const std::string& name, pid_t pid) {
  const std::string tmp = dir + "/." + name + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return;
  std::fprintf(f, "%d\n", static_cast<int>(pid));
  std::fclose(f);
  std::rename(tmp.c_str(), (dir + "/" + name).c_str());
}

// Waits (at most 10 s) until every rank of the job has written its file `<prefix><rank><suffix>`.
void wait_for_pids(const std::string& dir, int world, const std::string& prefix = "", const std::string& suffix = ".pid") {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    int have = 0;
    for (int r = 0; r < world; ++r)
      if (access((dir + "/" + prefix + std::to_string(r) + suffix).c_str(), F_OK) == 0) ++have;
    if (have == world) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string pid_dir;
  bool print_env = false, to_stderr = false, partial = false, ignore_term = false, grandchild = false;
  int exit_rank = -1, exit_code = 0, kill_rank = -1, sig = SIGKILL;
  double sleep_s = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "launch_fixture: %s needs a value\n", a.c_str());
        std::exit(64);
      }
      return argv[++i];
    };
    if (a == "--pid-dir") pid_dir = next();
    else if (a == "--print-env") print_env = true;
    else if (a == "--stderr") to_stderr = true;
    else if (a == "--partial") partial = true;
    else if (a == "--ignore-term") ignore_term = true;
    else if (a == "--grandchild") grandchild = true;
    else if (a == "--exit-rank") exit_rank = std::atoi(next().c_str());
    else if (a == "--exit-code") exit_code = std::atoi(next().c_str());
    else if (a == "--kill-rank") kill_rank = std::atoi(next().c_str());
    else if (a == "--signal") sig = std::atoi(next().c_str());
    else if (a == "--sleep") sleep_s = std::atof(next().c_str());
    else {
      std::fprintf(stderr, "launch_fixture: unknown argument %s\n", a.c_str());
      return 64;
    }
  }
  const int rank = std::atoi(env("RANK").c_str());
  const int world = std::atoi(env("WORLD_SIZE").c_str());
  if (ignore_term) signal(SIGTERM, SIG_IGN);
  if (!pid_dir.empty()) write_pid(pid_dir, std::to_string(rank) + ".pid", getpid());
  if (grandchild) {
    const pid_t pid = fork();
    if (pid == 0) {
      sleep(60);
      _exit(0);
    }
    if (!pid_dir.empty()) write_pid(pid_dir, std::to_string(rank) + ".child.pid", pid);
  }
  if (print_env) {
    std::printf("env RANK=%s WORLD_SIZE=%s LOCAL_RANK=%s LOCAL_WORLD_SIZE=%s MASTER_ADDR=%s MASTER_PORT=%s GROUP_RANK=%s "
                "TESSEL_NNODES=%s TOKEN_LEN=%zu ELASTIC=%s ROUND=%s PREFIX=%s\n",
                env("RANK").c_str(), env("WORLD_SIZE").c_str(), env("LOCAL_RANK").c_str(),
                env("LOCAL_WORLD_SIZE").c_str(), env("MASTER_ADDR").c_str(), env("MASTER_PORT").c_str(),
                env("GROUP_RANK").c_str(), env("TESSEL_NNODES").c_str(), env("TESSEL_JOB_TOKEN").size(),
                env("TESSEL_ELASTIC").c_str(), env("TESSEL_ELASTIC_ROUND").c_str(), env("TESSEL_STORE_PREFIX").c_str());
  }
  if (to_stderr) std::fprintf(stderr, "stderr of rank %d\n", rank);
  if (partial) std::printf("partial-%d", rank);
  std::fflush(stdout);
  std::fflush(stderr);
  // Printed: a rank that exits or kills itself waits for every rank of this (elastic) round to
  // have printed, so the launcher's teardown cannot cut another rank's lines short.
  const std::string printed = ".printed" + env("TESSEL_ELASTIC_ROUND");
  if (!pid_dir.empty()) write_pid(pid_dir, "." + std::to_string(rank) + printed, getpid());  // hidden: not a worker's pid

  if (rank == exit_rank || rank == kill_rank) {
    if (!pid_dir.empty()) wait_for_pids(pid_dir, world, ".", printed);
    if (rank == exit_rank) return exit_code;
    signal(sig, SIG_DFL);
    raise(sig);
    return 0;
  }
  if (sleep_s > 0) {
    // A plain sleep that an ignored SIGTERM cannot cut short.
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(sleep_s);
    while (std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}
