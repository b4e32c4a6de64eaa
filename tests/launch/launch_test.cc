// `tessel launch` end to end: the real binary runs launch_fixture workers. Checks the
// failure path (a failed rank stops the job, is named, and leaves no worker alive), the
// environment and rank-prefixed output, signals, a missing program, two launchers forming
// a two-node job on loopback, Ctrl-C, and bad flags. Every launcher run has a hard time
// limit and is SIGKILLed (with any worker whose pid it wrote) if it overstays.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

const std::string kTessel = TESSEL_BINARY;
const std::string kFixture = LAUNCH_FIXTURE;
const std::string kCommWorker = LAUNCH_COMM_WORKER;

struct Result {
  bool exited = false;  // exited normally (else killed by a signal or timed out)
  int code = -1;
  bool timed_out = false;
  std::string out, err;
  double seconds = 0;
};

// A running `tessel ARGS...` whose stdout/stderr a thread collects; SIGKILLed when it runs
// past `limit`.
class Proc {
 public:
  explicit Proc(std::vector<std::string> args, Clock::duration limit = 30s) : start_(Clock::now()) {
    args.insert(args.begin(), kTessel);
    // Built before fork: the child of a threaded process should only exec.
    std::vector<char*> argv, envp;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (char** e = environ; *e != nullptr; ++e)
      if (std::string_view(*e).rfind("TESSEL_JOB_TOKEN=", 0) != 0) envp.push_back(*e);
    envp.push_back(nullptr);
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) std::abort();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    collector_ = std::thread([this, o = out[0], e = err[0], limit] { collect(o, e, limit); });
  }
  ~Proc() {
    if (collector_.joinable()) {
      ::kill(pid_, SIGKILL);
      collector_.join();
    }
  }
  pid_t pid() const { return pid_; }
  Result wait() {
    if (collector_.joinable()) collector_.join();
    return result_;
  }

 private:
  void collect(int out_fd, int err_fd, Clock::duration limit) {
    int fds[2] = {out_fd, err_fd};
    std::string* bufs[2] = {&result_.out, &result_.err};
    bool reaped = false;
    Clock::time_point reaped_at{};
    while (true) {
      int status = 0;
      if (!reaped && ::waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped = true;
        reaped_at = Clock::now();
        result_.exited = WIFEXITED(status);
        result_.code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
        result_.seconds = std::chrono::duration<double>(reaped_at - start_).count();
      }
      if (!reaped && Clock::now() - start_ > limit) {
        result_.timed_out = true;
        ::kill(pid_, SIGKILL);
      }
      const bool open = fds[0] >= 0 || fds[1] >= 0;
      if (reaped && (!open || Clock::now() - reaped_at > 2s)) break;
      pollfd p[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
      ::poll(p, 2, 20);
      for (int i = 0; i < 2; ++i) {
        if (fds[i] < 0 || p[i].revents == 0) continue;
        char buf[4096];
        const ssize_t k = ::read(fds[i], buf, sizeof buf);
        if (k > 0) {
          bufs[i]->append(buf, static_cast<std::size_t>(k));
        } else {
          ::close(fds[i]);
          fds[i] = -1;
        }
      }
    }
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
  }

  Clock::time_point start_;
  pid_t pid_ = -1;
  std::thread collector_;
  Result result_;
};

Result run_tessel(std::vector<std::string> args, Clock::duration limit = 30s) { return Proc(std::move(args), limit).wait(); }

// A scratch folder for pid files; on teardown every pid written there is SIGKILLed, so a
// failing test cannot leave workers behind.
bool is_zombie(pid_t pid);

class PidDir {
 public:
  PidDir() {
    std::string tmpl = (fs::temp_directory_path() / "tessel-launch-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    path_ = tmpl;
  }
  ~PidDir() {
    for (pid_t p : pids()) ::kill(p, SIGKILL);
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string path() const { return path_.string(); }
  std::map<std::string, pid_t> files() const {
    std::map<std::string, pid_t> out;
    for (const auto& e : fs::directory_iterator(path_)) {
      const std::string name = e.path().filename().string();
      if (name.empty() || name[0] == '.') continue;
      std::ifstream f(e.path());
      int pid = 0;
      if (f >> pid && pid > 0) out[name] = pid;
    }
    return out;
  }
  std::vector<pid_t> pids() const {
    std::vector<pid_t> out;
    for (const auto& [name, pid] : files()) out.push_back(pid);
    return out;
  }
  // Waits until `n` pid files exist (or 10 s pass).
  bool wait_for(std::size_t n) const {
    const auto until = Clock::now() + 10s;
    while (Clock::now() < until) {
      if (files().size() >= n) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
  // The pids still alive after allowing `grace` for reaping. Workers are the launcher's
  // children and must be gone (ESRCH); a worker's own child (<R>.child.pid) is an orphan
  // that init reaps in its own time, so a zombie counts as dead there.
  std::vector<pid_t> alive(Clock::duration grace = 2s) const {
    const auto until = Clock::now() + grace;
    std::vector<pid_t> left;
    do {
      left.clear();
      for (const auto& [name, p] : files()) {
        if (::kill(p, 0) == -1 && errno == ESRCH) continue;
        if (name.find(".child.") != std::string::npos && is_zombie(p)) continue;
        left.push_back(p);
      }
      if (left.empty()) break;
      std::this_thread::sleep_for(20ms);
    } while (Clock::now() < until);
    return left;
  }

 private:
  fs::path path_;
};

bool is_zombie(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(f, stat);
  const std::size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

std::string show(const Result& r) {
  return "exit " + std::to_string(r.code) + (r.timed_out ? " (timed out)" : "") + " after " +
         std::to_string(r.seconds) + " s\n--- stdout\n" + r.out + "--- stderr\n" + r.err;
}

// (a) The acceptance test: a failing rank stops the whole job quickly, is named with its
// exit code, and no worker survives.
TEST(Launch, FailedRankStopsEveryWorkerAndIsReported) {
  PidDir dir;
  Result r = run_tessel({"launch", "--nproc-per-node", "2", "--", kFixture, "--exit-rank", "1", "--exit-code", "3",
                         "--sleep", "60", "--pid-dir", dir.path()});
  std::cout << "[ measured ] tessel launch exited " << r.code << " after " << r.seconds << " s\n";
  EXPECT_FALSE(r.timed_out) << show(r);
  EXPECT_TRUE(r.exited) << show(r);
  EXPECT_NE(r.code, 0) << show(r);
  EXPECT_LT(r.seconds, 10.0) << show(r);
  EXPECT_TRUE(contains(r.err, "error: rank 1 exited with code 3")) << show(r);
  EXPECT_TRUE(contains(r.err, "rank 0 was killed by signal 15")) << show(r);
  EXPECT_EQ(dir.files().size(), 2u);
  EXPECT_EQ(dir.alive(), std::vector<pid_t>{});
}

// (b) torchrun's environment for three processes, rank-prefixed lines on both streams, and
// a last line without '\n' still forwarded.
TEST(Launch, SetsTheEnvironmentAndPrefixesEveryLine) {
  Result r = run_tessel({"launch", "--nproc-per-node", "3", "--", kFixture, "--print-env", "--stderr", "--partial"});
  ASSERT_EQ(r.code, 0) << show(r);
  std::set<int> env_ranks, partial_ranks, stderr_ranks;
  std::set<int> ports;
  // Parses "[rank R] <format>" with sscanf; true when the whole line matched.
  auto match = [](const std::string& line, const char* format, int* a, int* b, int* c = nullptr, int* d = nullptr) {
    int n = -1;
    const int got = c == nullptr ? std::sscanf(line.c_str(), format, a, b, &n)
                    : d == nullptr ? std::sscanf(line.c_str(), format, a, b, c, &n)
                                   : std::sscanf(line.c_str(), format, a, b, c, d, &n);
    return got == (c == nullptr ? 2 : d == nullptr ? 3 : 4) && n == static_cast<int>(line.size());
  };
  for (const std::string& line : lines_of(r.out)) {
    EXPECT_EQ(line.rfind("[rank ", 0), 0u) << "unprefixed line: " << line;
    int prefix = -1, rank = -1, local = -1, port = -1;
    if (match(line,
              "[rank %d] env RANK=%d WORLD_SIZE=3 LOCAL_RANK=%d LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 "
              "MASTER_PORT=%d GROUP_RANK=0 TESSEL_NNODES=1 TOKEN_LEN=32 ELASTIC= ROUND= PREFIX=%n",
              &prefix, &rank, &local, &port)) {
      EXPECT_EQ(prefix, rank);
      EXPECT_EQ(prefix, local);
      EXPECT_GT(port, 0);
      env_ranks.insert(prefix);
      ports.insert(port);
    } else if (match(line, "[rank %d] partial-%d%n", &prefix, &rank)) {
      EXPECT_EQ(prefix, rank);
      partial_ranks.insert(prefix);
    } else {
      ADD_FAILURE() << "unexpected line: " << line;
    }
  }
  for (const std::string& line : lines_of(r.err)) {
    int prefix = -1, rank = -1;
    if (match(line, "[rank %d] stderr of rank %d%n", &prefix, &rank)) {
      EXPECT_EQ(prefix, rank);
      stderr_ranks.insert(prefix);
    } else {
      ADD_FAILURE() << "unexpected stderr line: " << line;
    }
  }
  const std::set<int> all = {0, 1, 2};
  EXPECT_EQ(env_ranks, all) << show(r);
  EXPECT_EQ(partial_ranks, all) << show(r);
  EXPECT_EQ(stderr_ranks, all) << show(r);
  EXPECT_EQ(ports.size(), 1u) << "ranks saw different MASTER_PORTs";
}

// (c)
TEST(Launch, ExitsZeroWhenEveryRankSucceeds) {
  PidDir dir;
  Result r = run_tessel({"launch", "--nproc-per-node", "4", "--", kFixture, "--sleep", "0.2", "--pid-dir", dir.path()});
  EXPECT_EQ(r.code, 0) << show(r);
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(dir.files().size(), 4u);
  EXPECT_EQ(dir.alive(), std::vector<pid_t>{});
}

// (d)
TEST(Launch, ARankKilledByASignalIsReportedWithTheSignalName) {
  PidDir dir;
  Result r = run_tessel({"launch", "--nproc-per-node", "3", "--", kFixture, "--kill-rank", "2", "--signal", "9",
                         "--sleep", "60", "--pid-dir", dir.path()});
  EXPECT_EQ(r.code, 1) << show(r);
  EXPECT_TRUE(contains(r.err, "error: rank 2 was killed by signal 9 (Killed)")) << show(r);
  EXPECT_EQ(dir.alive(), std::vector<pid_t>{});
}

// Workers that ignore SIGTERM get SIGKILL after --kill-grace, and so do their children.
TEST(Launch, WorkersIgnoringSigtermAreKilledAfterTheGracePeriod) {
  PidDir dir;
  Result r = run_tessel({"launch", "--nproc-per-node", "2", "--kill-grace", "0.5", "--", kFixture, "--exit-rank", "0",
                         "--exit-code", "7", "--ignore-term", "--grandchild", "--sleep", "60", "--pid-dir", dir.path()});
  EXPECT_EQ(r.code, 1) << show(r);
  EXPECT_LT(r.seconds, 10.0) << show(r);
  EXPECT_TRUE(contains(r.err, "error: rank 0 exited with code 7")) << show(r);
  EXPECT_TRUE(contains(r.err, "rank 1 was killed by signal 9 (Killed) after the launcher stopped it")) << show(r);
  EXPECT_EQ(dir.files().size(), 4u);  // two workers, two grandchildren
  EXPECT_EQ(dir.alive(), std::vector<pid_t>{});
}

// (e)
TEST(Launch, AMissingProgramIsAClearError) {
  for (const std::string prog : {"/nonexistent/tessel-worker", "tessel-no-such-program"}) {
    Result r = run_tessel({"launch", "--nproc-per-node", "2", "--", prog, "--flag"});
    EXPECT_EQ(r.code, 1) << show(r);
    EXPECT_TRUE(contains(r.err, "rank 0: cannot run '" + prog + "': No such file or directory")) << show(r);
  }
}

std::vector<std::string> node_args(int node, int port, const std::string& token) {
  return {"launch",  "--nnodes", "2", "--node-rank", std::to_string(node), "--master", "127.0.0.1:" + std::to_string(port),
          "--token", token,      "--nproc-per-node", "2", "--rendezvous-timeout", "20"};
}

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// (f) Two launchers on this machine form a two-node job; rank 3 (node 1) fails.
TEST(Launch, TwoNodesStopTogetherWhenARankOnNodeOneFails) {
  PidDir dir;
  const int port = free_port();
  const std::vector<std::string> work = {"--", kFixture, "--exit-rank", "3", "--exit-code", "5", "--sleep", "60",
                                         "--pid-dir", dir.path()};
  const auto t0 = Clock::now();
  Proc node1(node_args(1, port, "tok-f") + work);  // node 1 first: it must wait for node 0
  std::this_thread::sleep_for(200ms);
  Proc node0(node_args(0, port, "tok-f") + work);
  Result r0 = node0.wait(), r1 = node1.wait();
  const double total = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(r0.code, 1) << show(r0);
  EXPECT_EQ(r1.code, 1) << show(r1);
  EXPECT_LT(total, 10.0);
  EXPECT_TRUE(contains(r1.err, "error: rank 3 (node 1) exited with code 5")) << show(r1);
  EXPECT_TRUE(contains(r0.err, "error: rank 3 (node 1) exited with code 5")) << show(r0);
  EXPECT_TRUE(contains(r0.err, "rank 0 (node 0) was killed by signal 15")) << show(r0);
  EXPECT_EQ(dir.files().size(), 4u);
  EXPECT_EQ(dir.alive(), std::vector<pid_t>{});
}

TEST(Launch, TwoNodesSucceedWithGlobalRanks) {
  PidDir dir;
  const int port = free_port();
  const std::vector<std::string> work = {"--", kFixture, "--print-env", "--pid-dir", dir.path()};
  Proc node0(node_args(0, port, "tok-s") + work);
  // Node 1 finishes later than node 0: node 0 must keep the store up until it is done.
  Proc node1(node_args(1, port, "tok-s") + std::vector<std::string>{"--", kFixture, "--print-env", "--sleep", "0.5"});
  Result r0 = node0.wait(), r1 = node1.wait();
  ASSERT_EQ(r0.code, 0) << show(r0);
  ASSERT_EQ(r1.code, 0) << show(r1);
  EXPECT_GE(r0.seconds, 0.5) << "node 0 returned before node 1 was done";
  for (int rank = 0; rank < 4; ++rank) {
    const int node = rank / 2;
    const std::string expect = "[rank " + std::to_string(rank) + "] env RANK=" + std::to_string(rank) +
                               " WORLD_SIZE=4 LOCAL_RANK=" + std::to_string(rank % 2) +
                               " LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
                               " GROUP_RANK=" + std::to_string(node) + " TESSEL_NNODES=2 TOKEN_LEN=5";
    EXPECT_TRUE(contains(node == 0 ? r0.out : r1.out, expect)) << expect << "\n" << show(node == 0 ? r0 : r1);
  }
  EXPECT_EQ(dir.alive(), std::vector<pid_t>{});
}

std::vector<std::string> elastic_args(int node, int port, const std::string& nnodes) {
  return {"launch", "--nnodes", nnodes, "--node-rank", std::to_string(node), "--master",
          "127.0.0.1:" + std::to_string(port), "--token", "tok-elastic", "--nproc-per-node", "2", "--last-call", "0.3",
          "--rendezvous-timeout", "20"};
}

// An elastic job whose other nodes never come starts with the minimum after --last-call.
TEST(Launch, ElasticJobStartsWithTheNodesThereAreAfterTheLastCall) {
  PidDir dir;
  Result r = run_tessel(elastic_args(0, free_port(), "1:3") +
                        std::vector<std::string>{"--", kFixture, "--print-env", "--pid-dir", dir.path()});
  ASSERT_EQ(r.code, 0) << show(r);
  EXPECT_TRUE(contains(r.err, "round 0: 1 node (--nnodes 1:3, closed 0.3 s after the minimum joined), world size 2 "
                              "of at most 6")) << show(r);
  EXPECT_TRUE(contains(r.out, "[rank 1] env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1")) << show(r);
  EXPECT_TRUE(contains(r.out, "ELASTIC=1:3 ROUND=0 PREFIX=elastic/0")) << show(r);
  EXPECT_EQ(dir.alive(), std::vector<pid_t>{});
}

// Each failed round counts against --max-restarts; the next round runs with the nodes alive.
TEST(Launch, ElasticFailedRoundsCountAgainstMaxRestarts) {
  PidDir pids;  // the failing rank exits once every rank of its round has printed
  Result r = run_tessel(elastic_args(0, free_port(), "1:2") +
                        std::vector<std::string>{"--max-restarts", "1", "--", kFixture, "--print-env", "--pid-dir", pids.path(),
                                                 "--exit-rank", "1", "--exit-code", "5"});
  EXPECT_EQ(r.code, 1) << show(r);
  EXPECT_TRUE(contains(r.err, "round 0 failed; restart 1 of at most 1: round 1 gathers the nodes still alive")) << show(r);
  EXPECT_TRUE(contains(r.err, "round 1: 1 node")) << show(r);
  EXPECT_TRUE(contains(r.err, "round 1 failed and the job has used its 1 restart (--max-restarts)")) << show(r);
  EXPECT_TRUE(contains(r.out, "[rank 0] env RANK=0 WORLD_SIZE=2")) << show(r);
  EXPECT_TRUE(contains(r.out, "ROUND=1 PREFIX=elastic/1")) << show(r);
}

// A node that joins a running round waits; node 0 stops the round and the next one has both.
TEST(Launch, ElasticJobGrowsWhenANodeJoins) {
  const int port = free_port();
  const std::vector<std::string> work = {"--", kFixture, "--print-env", "--sleep", "3"};
  const auto t0 = Clock::now();
  Proc node0(elastic_args(0, port, "1:2") + work);
  std::this_thread::sleep_for(1500ms);  // round 0 has started with node 0 alone
  Proc node1(elastic_args(1, port, "1:2") + work);
  Result r0 = node0.wait(), r1 = node1.wait();
  ASSERT_EQ(r0.code, 0) << show(r0);
  ASSERT_EQ(r1.code, 0) << show(r1);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 15.0);
  EXPECT_TRUE(contains(r0.err, "round 0: 1 node")) << show(r0);
  EXPECT_TRUE(contains(r0.err, "membership change: 1 node(s) waiting to join")) << show(r0);
  EXPECT_TRUE(contains(r0.err, "round 1: 2 nodes (--nnodes 1:2, all of them), world size 4")) << show(r0);
  EXPECT_FALSE(contains(r0.err, "restart 1")) << "growing is not a restart\n" << show(r0);
  EXPECT_TRUE(contains(r1.err, "this node waits and joins at the next membership change")) << show(r1);
  EXPECT_TRUE(contains(r0.out, "[rank 0] env RANK=0 WORLD_SIZE=2")) << show(r0);
  EXPECT_TRUE(contains(r0.out, "[rank 0] env RANK=0 WORLD_SIZE=4")) << show(r0);
  EXPECT_TRUE(contains(r1.out, "[rank 3] env RANK=3 WORLD_SIZE=4 LOCAL_RANK=1")) << show(r1);
  EXPECT_TRUE(contains(r1.out, "GROUP_RANK=1 TESSEL_NNODES=2")) << show(r1);
}

TEST(Launch, RendezvousTimesOutNamingTheMissingNode) {
  const int port = free_port();
  std::vector<std::string> args = node_args(0, port, "tok-r");
  args.back() = "0.5";  // --rendezvous-timeout
  Result r = run_tessel(args + std::vector<std::string>{"--", kFixture});
  EXPECT_EQ(r.code, 1) << show(r);
  EXPECT_TRUE(contains(r.err, "node rank(s) 1 did not join")) << show(r);
}

TEST(Launch, ANodeWithTheWrongTokenIsRejected) {
  const int port = free_port();
  std::vector<std::string> a0 = node_args(0, port, "right"), a1 = node_args(1, port, "wrong");
  a0.back() = "3";
  a1.back() = "3";
  Proc node0(a0 + std::vector<std::string>{"--", kFixture});
  std::this_thread::sleep_for(200ms);
  Result r1 = Proc(a1 + std::vector<std::string>{"--", kFixture}).wait();
  Result r0 = node0.wait();
  EXPECT_EQ(r1.code, 1) << show(r1);
  EXPECT_TRUE(contains(r1.err, "rejected")) << show(r1);
  EXPECT_EQ(r0.code, 1) << show(r0);
  EXPECT_TRUE(contains(r0.err, "node rank(s) 1 did not join")) << show(r0);
}

// The token can come from a file (never the command line, which `ps` shows to every user);
// --token still works but warns.
TEST(Launch, TheTokenComesFromAFileAndTheCommandLineWarns) {
  PidDir dir;
  const std::string file = dir.path() + "/job.token";
  {
    std::ofstream f(file);
    f << "0123456789abcdef0123456789abcdef\n";
  }
  ::chmod(file.c_str(), 0600);
  const int port = free_port();
  auto args = [&](int node) {
    std::vector<std::string> a = node_args(node, port, "unused");
    a[7] = "--token-file";
    a[8] = file;
    return a + std::vector<std::string>{"--", kFixture, "--print-env"};
  };
  Proc node0(args(0));
  Result r1 = Proc(args(1)).wait();
  Result r0 = node0.wait();
  ASSERT_EQ(r0.code, 0) << show(r0);
  ASSERT_EQ(r1.code, 0) << show(r1);
  EXPECT_TRUE(contains(r1.out, "[rank 3] env RANK=3 ")) << show(r1);
  EXPECT_TRUE(contains(r1.out, "TOKEN_LEN=32")) << show(r1);
  EXPECT_FALSE(contains(r0.err + r1.err, "warning")) << show(r0) << show(r1);

  Result r = run_tessel({"launch", "--nproc-per-node", "1", "--token", "visible", "--", kFixture});
  EXPECT_EQ(r.code, 0) << show(r);
  EXPECT_TRUE(contains(r.err, "warning: --token is visible to every user")) << show(r);
  ::chmod(file.c_str(), 0644);
  r = run_tessel({"launch", "--nproc-per-node", "1", "--token-file", file, "--", kFixture});
  EXPECT_EQ(r.code, 0) << show(r);
  EXPECT_TRUE(contains(r.err, "can be read by other users")) << show(r);
}

// (g) Ctrl-C stops every worker and exits 130.
TEST(Launch, SigintStopsEveryWorkerAndExits130) {
  PidDir dir;
  Proc launcher({"launch", "--nproc-per-node", "2", "--", kFixture, "--sleep", "60", "--grandchild", "--pid-dir",
                 dir.path()});
  ASSERT_TRUE(dir.wait_for(4)) << "workers did not start";
  ::kill(launcher.pid(), SIGINT);
  Result r = launcher.wait();
  EXPECT_EQ(r.code, 130) << show(r);
  EXPECT_LT(r.seconds, 10.0) << show(r);
  EXPECT_TRUE(contains(r.err, "interrupted by SIGINT")) << show(r);
  EXPECT_EQ(dir.alive(), std::vector<pid_t>{});
}

// SIGTERM (a batch system ending the job) stops every worker too, and the exit status follows
// the shell's convention for a signal: 128 + 15.
TEST(Launch, SigtermStopsEveryWorkerAndExits143) {
  PidDir dir;
  Proc launcher({"launch", "--nproc-per-node", "2", "--", kFixture, "--sleep", "60", "--pid-dir", dir.path()});
  ASSERT_TRUE(dir.wait_for(2)) << "workers did not start";
  ::kill(launcher.pid(), SIGTERM);
  Result r = launcher.wait();
  EXPECT_EQ(r.code, 143) << show(r);
  EXPECT_LT(r.seconds, 10.0) << show(r);
  EXPECT_TRUE(contains(r.err, "interrupted by SIGTERM")) << show(r);
  EXPECT_EQ(dir.alive(), std::vector<pid_t>{});
}

// The acceptance test of hang detection: with --timeout 5, a rank that is stopped (SIGSTOP)
// in the middle of a job of two real tessel ranks is reported by its heartbeat, named with
// what it was doing, within 10 s — not when the collectives time out — and every process is
// gone afterwards (the stopped one included).
TEST(Launch, AStoppedRankIsCaughtByItsHeartbeatWithinSeconds) {
  PidDir dir;
  Proc launcher({"launch", "--nproc-per-node", "2", "--timeout", "5", "--", kCommWorker, "--pid-dir", dir.path(),
                 "--seconds", "60"},
                60s);
  ASSERT_TRUE(dir.wait_for(2)) << "workers did not start";
  std::this_thread::sleep_for(1s);  // both in their loop, beating
  const pid_t victim = dir.files().at("1.pid");
  ASSERT_EQ(::kill(victim, SIGSTOP), 0);
  const auto stopped_at = Clock::now();
  Result r = launcher.wait();
  const double after = std::chrono::duration<double>(Clock::now() - stopped_at).count();
  std::cout << "[ measured ] rank 1 SIGSTOPped; tessel launch --timeout 5 exited " << r.code << " " << after
            << " s later\n";
  EXPECT_EQ(r.code, 1) << show(r);
  EXPECT_LT(after, 10.0) << show(r);
  EXPECT_TRUE(contains(r.err, "error: rank 1 stopped responding: no heartbeat for")) << show(r);
  EXPECT_TRUE(contains(r.err, "the process is stopped")) << show(r);
  EXPECT_TRUE(contains(r.err, "said: in comm_worker step loop")) << show(r);
  EXPECT_EQ(dir.alive(), std::vector<pid_t>{});
}

// The timeout reaches the processes; a bad one is bad input.
TEST(Launch, TimeoutIsGivenToTheProcesses) {
  Result r = run_tessel({"launch", "--nproc-per-node", "1", "--timeout", "7.5", "--", "/bin/sh", "-c",
                         "echo timeout=$TESSEL_TIMEOUT_S heartbeat=$TESSEL_HEARTBEAT_MS"});
  EXPECT_EQ(r.code, 0) << show(r);
  EXPECT_TRUE(contains(r.out, "[rank 0] timeout=7.500 heartbeat=")) << show(r);
  for (const char* bad : {"0", "-1", "inf", "nan"}) {
    r = run_tessel({"launch", "--nproc-per-node", "1", "--timeout", bad, "--", "true"});
    EXPECT_EQ(r.code, 2) << bad << ": " << show(r);
    EXPECT_TRUE(contains(r.err, "--timeout")) << show(r);
  }
}

std::string write_tiny_config(const PidDir& dir) {
  const std::string path = dir.path() + "/tiny.yaml";
  std::ofstream f(path);
  f << "model: {arch: gpt2, n_layer: 1, n_embd: 16, n_head: 2, vocab_size: 256, n_positions: 16}\n"
       "data: {path: " TESSEL_SOURCE_DIR "/data/kjv.txt, format: text}\n"
       "train: {steps: 1000000, global_batch: 2, seq_len: 8, threads: 1}\n"
       "parallel: {dp: 2}\n"
       "log: {every: 1000000}\n";
  return path;
}

// `tessel train --timeout` reaches the collectives of a Gloo run: with rank 1 stopped, rank 0
// fails after 3 s naming it (and what its heartbeat last said), long before the launcher's
// own heartbeat limit (30 s for its default timeout of 300 s) would.
TEST(Launch, TrainTimeoutFlagSetsTheCollectiveTimeout) {
  PidDir dir;
  const std::string config = write_tiny_config(dir), metrics = dir.path() + "/metrics.jsonl";
  Proc launcher({"launch", "--nproc-per-node", "2", "--", kTessel, "train", config, "--backend", "gloo", "--timeout",
                 "3", "--metrics", metrics},
                90s);
  // Training runs once rank 0 wrote a step's metrics.
  const auto until = Clock::now() + 60s;
  while (Clock::now() < until && (!fs::exists(metrics) || fs::file_size(metrics) == 0))
    std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(fs::exists(metrics) && fs::file_size(metrics) > 0) << show(launcher.wait());
  std::ifstream children("/proc/" + std::to_string(launcher.pid()) + "/task/" + std::to_string(launcher.pid()) +
                         "/children");
  pid_t rank1 = -1;
  for (pid_t p; children >> p;) {
    std::ifstream env("/proc/" + std::to_string(p) + "/environ");
    for (std::string var; std::getline(env, var, '\0');)
      if (var == "RANK=1") rank1 = p;
  }
  ASSERT_GT(rank1, 0) << "rank 1's process not found";
  ASSERT_EQ(::kill(rank1, SIGSTOP), 0);
  const auto stopped_at = Clock::now();
  Result r = launcher.wait();
  const double after = std::chrono::duration<double>(Clock::now() - stopped_at).count();
  std::cout << "[ measured ] rank 1 of a tessel train --timeout 3 run SIGSTOPped; the job failed " << after
            << " s later\n";
  EXPECT_EQ(r.code, 1) << show(r);
  EXPECT_LT(after, 15.0) << show(r);
  EXPECT_TRUE(contains(r.err, "error: rank 0 exited with code 1")) << show(r);
  EXPECT_TRUE(contains(r.err, "timed out after 3000 ms")) << show(r);
  EXPECT_TRUE(contains(r.err, "missing world ranks [1]")) << show(r);
  EXPECT_TRUE(contains(r.err, "rank 1's last heartbeat")) << show(r);
}

TEST(Launch, TrainRefusesABadTimeout) {
  PidDir dir;
  const std::string config = write_tiny_config(dir);
  Result r = run_tessel({"train", config, "--timeout", "0"});
  EXPECT_EQ(r.code, 2) << show(r);
  EXPECT_TRUE(contains(r.err, "--timeout")) << show(r);
  for (const char* bad : {"-1", ".inf", "1e9"}) {
    r = run_tessel({"train", config, "--set", std::string("parallel.timeout_s=") + bad});
    EXPECT_EQ(r.code, 2) << bad << ": " << show(r);
    EXPECT_TRUE(contains(r.err, "parallel.timeout_s")) << show(r);
  }
}

// A launcher that is itself SIGKILLed cannot clean up: its workers die with it anyway.
TEST(Launch, WorkersDieWithASigkilledLauncher) {
  PidDir dir;
  Proc launcher({"launch", "--nproc-per-node", "2", "--", kFixture, "--sleep", "60", "--pid-dir", dir.path()});
  ASSERT_TRUE(dir.wait_for(2)) << "workers did not start";
  ::kill(launcher.pid(), SIGKILL);
  launcher.wait();
  // Orphaned workers are reaped by init, not by the test: a zombie counts as dead here.
  const auto until = Clock::now() + 5s;
  std::vector<pid_t> left;
  do {
    left.clear();
    for (pid_t p : dir.pids())
      if (!(::kill(p, 0) == -1 && errno == ESRCH) && !is_zombie(p)) left.push_back(p);
    std::this_thread::sleep_for(20ms);
  } while (!left.empty() && Clock::now() < until);
  EXPECT_EQ(left, std::vector<pid_t>{});
}

// (h) Values that cannot describe a job exit 2 and name the flag.
TEST(Launch, BadOptionsExitTwoNamingTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  const std::vector<std::string> work = {"--", "true"};
  const std::vector<Case> cases = {
      {{"--nnodes", "2", "--node-rank", "2", "--master", "127.0.0.1:29999", "--token", "t", "--nproc-per-node", "1"},
       "--node-rank"},
      {{"--nnodes", "2", "--nproc-per-node", "1", "--token", "t"}, "--master"},
      {{"--nnodes", "2", "--master", "127.0.0.1", "--nproc-per-node", "1", "--token", "t"}, "--master"},
      {{"--nnodes", "2", "--master", "127.0.0.1:29999", "--nproc-per-node", "1"}, "--token"},
      {{"--nproc-per-node", "0"}, "--nproc-per-node"},
      {{"--nproc-per-node", "1", "--node-rank", "-1"}, "--node-rank"},
      {{"--nproc-per-node", "1", "--master", "127.0.0.1:http"}, "--master"},
      {{"--nproc-per-node", "1", "--nnodes", "4:1"}, "--nnodes"},
      {{"--nproc-per-node", "1", "--nnodes", "zero"}, "--nnodes"},
      {{"--nproc-per-node", "1", "--rendezvous-timeout", "0"}, "--rendezvous-timeout"},
      // A store beyond loopback with a guessable token; a token file that is not there, or is a
      // folder; a token given twice.
      {{"--nnodes", "2", "--node-rank", "1", "--master", "10.255.0.1:29999", "--token", "short", "--nproc-per-node", "1"},
       "at least 128 bits"},
      {{"--nproc-per-node", "1", "--master", "10.255.0.1:29999", "--token", "0123456789abcdef0123456789abcde"},
       "at least 128 bits"},
      {{"--nproc-per-node", "1", "--token-file", "/nonexistent/job.token"}, "--token-file '/nonexistent/job.token'"},
      {{"--nproc-per-node", "1", "--token-file", "/tmp"}, "not a regular file"},
      {{"--nproc-per-node", "1", "--token-file", "/dev/null", "--token", "t"}, "--token and --token-file"},
      {{"--nproc-per-node", "1", "--no-such-flag"}, "--no-such-flag"},
  };
  for (const Case& c : cases) {
    Result r = run_tessel(std::vector<std::string>{"launch"} + c.args + work);
    EXPECT_EQ(r.code, 2) << show(r);
    EXPECT_TRUE(contains(r.err, c.expect)) << "expected '" << c.expect << "' in:\n" << show(r);
  }
  Result r = run_tessel({"launch", "--nproc-per-node", "1"});  // no program
  EXPECT_EQ(r.code, 2) << show(r);
  EXPECT_TRUE(contains(r.err, "PROGRAM")) << show(r);
}

TEST(Launch, HelpExplainsFlagsAndEnvironment) {
  Result r = run_tessel({"launch", "--help"});
  EXPECT_EQ(r.code, 0) << show(r);
  for (const char* word : {"--nproc-per-node", "--nnodes", "--node-rank", "--master", "--token", "--token-file",
                           "--rendezvous-timeout", "--timeout", "TESSEL_TIMEOUT_S",
                           "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                           "GROUP_RANK", "TESSEL_JOB_TOKEN"})
    EXPECT_TRUE(contains(r.out, word)) << word << " missing from --help:\n" << r.out;
}

}  // namespace
