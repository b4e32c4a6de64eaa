// The launcher: rendezvous of the nodes through node 0's TcpStore, fork/exec of this node's
// processes, rank-prefixed output, and one poll() loop that watches the processes' pipes,
// their exits (SIGCHLD self-pipe plus waitpid every round), the job's failure key and the
// launcher's own SIGINT/SIGTERM. Whatever happens, the Launcher's destructor SIGKILLs and
// reaps every process group it started.
#include "tessel/launch/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>

#include "tessel/comm/heartbeat.h"
#include "tessel/comm/socket.h"
#include "tessel/comm/tcp_store.h"
#include "tessel/core/error.h"
#include "tessel/launch/attempt.h"
#include "tessel/launch/job_options.h"
#include "tessel/launch/signals.h"

namespace tessel {

namespace {

using net::Clock;
using net::Deadline;

constexpr Millis kStorePoll{100};          // how often the failure key is checked
constexpr Millis kHeartbeat{1000};         // how often a node != 0 proves it is alive
constexpr Millis kHeartbeatTimeout{30'000};  // node 0 gives up on a silent node after this
constexpr Millis kDrain{1000};             // output read after the last process exited
constexpr Millis kAckWait{5000};           // node 0 keeps the store up this long after a failure
constexpr std::size_t kMaxLine = 64 << 10;  // a longer line without '\n' is forwarded in pieces

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* name = ::strsignal(WTERMSIG(status));
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), name != nullptr ? name : "unknown");
  }
  return fmt::format("ended with wait status {}", status);
}

// ---------------------------------------------------------------------------------------

struct Stream {
  net::Fd fd;
  int dest = 1;  // the launcher's stdout or stderr
  std::string partial;
};

struct Child {
  int local = 0;
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  bool spawn_failed = false;
  bool stopped_by_us = false;  // still running when the launcher began stopping the job
  int status = 0;
  Stream out, err;
};

class Launcher {
 public:
  Launcher(LaunchOptions options, SignalScope& signals, const Round* round)
      : o_(std::move(options)), signals_(signals), round_(round), grace_(o_.kill_grace),
        keys_(round != nullptr ? round->prefix + "/launch" : "launch"), timing_(HeartbeatTiming::for_timeout(o_.timeout)),
        ranks_watch_(std::make_unique<HeartbeatMonitor>(timing_.silence)) {}
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  int run();

 private:
  enum class WaitEnd { done, timeout, interrupted, failed };

  bool connect_store();
  bool rendezvous();
  void spawn_all();
  std::string spawn(Child& c);
  void supervise();
  void forward(Stream& s, const std::string& prefix);
  void flush_partial(Stream& s, const std::string& prefix);
  void reap();
  void begin_stop();
  void kill_all(int sig);
  void on_signals();
  void watch_store();
  void watch_heartbeats();
  void fail(const std::string& message, bool local);
  WaitEnd wait_until(const std::function<bool()>& done, Deadline deadline);
  int finish();
  void report_fates();
  std::string node_key(const char* what, int node) const { return fmt::format("{}/{}/{}", keys_, what, node); }
  std::string failed_key() const { return keys_ + "/failed"; }
  void check_membership();
  std::string who(int rank) const {
    return o_.nnodes > 1 ? fmt::format("rank {} (node {})", rank, o_.node_rank) : fmt::format("rank {}", rank);
  }
  bool all_exited() const {
    for (const Child& c : children_)
      if (c.running) return false;
    return true;
  }

  LaunchOptions o_;
  SignalScope& signals_;
  const Round* round_;   // the elastic round this attempt is (null: a fixed-size job)
  Millis grace_;         // SIGTERM to SIGKILL when stopping: --kill-grace, longer for a planned stop
  std::string keys_;     // the launchers' keys: "launch", or "<round prefix>/launch"
  std::unique_ptr<TcpStoreServer> server_;
  std::shared_ptr<TcpStore> store_;
  std::shared_ptr<Store> ranks_store_;  // the processes' keys (their heartbeats): the round's namespace
  std::string store_where_;
  int master_port_ = 0;
  std::vector<Child> children_;

  // What ended (or is ending) the job.
  std::string failure_;        // the job's failure message, local or from another node
  bool local_failure_ = false;  // failure_ happened on this node
  int interrupted_ = 0;        // the signal that interrupted the launcher
  bool stopping_ = false;
  Deadline kill_at_{};
  bool killed_ = false;
  bool store_lost_ = false;
  bool joined_ = false;         // the rendezvous completed
  int signals_seen_ = 0;        // SIGINT/SIGTERM received so far
  Deadline next_store_poll_{};
  Deadline next_heartbeat_{};
  struct Beat {
    int64_t value = -1;
    Deadline changed{};
    bool finished = false;
  };
  std::vector<Beat> beats_;
  HeartbeatTiming timing_;
  std::unique_ptr<HeartbeatMonitor> ranks_watch_;  // this node's processes' heartbeats
  Deadline next_rank_check_{};
};

Launcher::~Launcher() {
  // Last line of defence (exceptions included): nothing this launcher started survives it.
  for (Child& c : children_) {
    if (c.pid <= 0) continue;
    ::killpg(c.pid, SIGKILL);
    if (c.running) {
      ::kill(c.pid, SIGKILL);
      while (::waitpid(c.pid, &c.status, 0) < 0 && errno == EINTR) {
      }
      c.running = false;
    }
  }
}

int Launcher::run() {
  if (round_ != nullptr) {
    // The elastic coordinator has connected and gathered the nodes of this round already.
    store_ = round_->store;
    master_port_ = round_->port;
    store_where_ = net::host_port(o_.master_host, master_port_);
    joined_ = true;
    beats_.assign(static_cast<std::size_t>(o_.nnodes), Beat{.changed = Clock::now()});
  } else {
    if (!connect_store()) return finish();
    if (!rendezvous()) return finish();
  }
  ranks_store_ = round_ != nullptr ? std::make_shared<PrefixStore>(round_->prefix, store_) : std::shared_ptr<Store>(store_);
  spawn_all();
  supervise();
  return finish();
}

// Node 0 hosts the store; every node (node 0 included) talks to it as a client.
bool Launcher::connect_store() {
  // Two connections per rank (its store client and its heartbeat) and one per launcher, with
  // room to spare.
  JobStore js = open_job_store(o_, o_.node_rank == 0, 2 * static_cast<std::size_t>(o_.nnodes) * o_.nproc_per_node,
                               fmt::format("node {}", o_.node_rank), [this] {
                                 on_signals();
                                 return interrupted_ != 0;
                               });
  server_ = std::move(js.server);
  master_port_ = js.port;
  store_where_ = js.where;
  if (!js.client) return false;
  store_ = std::move(js.client);
  store_->set_timeout(Millis(30'000));
  return true;
}

bool Launcher::rendezvous() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string me = fmt::format("host {}, pid {}", host, ::getpid());
  const std::string holder = store_->compare_set(node_key("node", o_.node_rank), "", me);
  TESSEL_CHECK(holder == me, "tessel launch: --node-rank {} has already joined the job at {} ({}); every node needs its "
               "own --node-rank in 0..{}", o_.node_rank, store_where_, holder, o_.nnodes - 1);
  std::vector<std::string> keys;
  for (int r = 0; r < o_.nnodes; ++r) keys.push_back(node_key("node", r));
  const WaitEnd end = wait_until([&] { return store_->check(keys); }, net::deadline_after(o_.rendezvous_timeout));
  if (end == WaitEnd::done) {
    joined_ = true;
    // Heartbeats are watched from now on; every node gets a full period to send its first.
    beats_.assign(static_cast<std::size_t>(o_.nnodes), Beat{.changed = Clock::now()});
    return true;
  }
  if (end == WaitEnd::timeout) {
    std::string missing;
    for (int r = 0; r < o_.nnodes; ++r)
      if (!store_->check({keys[r]})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    const std::string msg = fmt::format(
        "tessel launch: rendezvous at {} timed out after {} ms: node rank(s) {} did not join (start `tessel launch "
        "--node-rank R` there with the same --nnodes, --master and --token)",
        store_where_, o_.rendezvous_timeout.count(), missing);
    try {
      store_->compare_set(failed_key(), "", msg);
    } catch (const CommError&) {
    }
    TESSEL_CHECK_AS(TimeoutError, false, "{}", msg);
  }
  return false;  // interrupted, or another node failed
}

void Launcher::spawn_all() {
  const int p = o_.nproc_per_node;
  children_.resize(static_cast<std::size_t>(p));
  for (int i = 0; i < p; ++i) {
    children_[i].local = i;
    children_[i].rank = o_.node_rank * p + i;
  }
  for (Child& c : children_) {
    const std::string why = spawn(c);
    if (!why.empty()) {
      fail(why, /*local=*/true);
      return;
    }
    on_signals();
    if (interrupted_ != 0) return;
  }
}

// Starts one process; returns why it could not run, or "".
std::string Launcher::spawn(Child& c) {
  const int p = o_.nproc_per_node;
  const std::vector<std::pair<std::string, std::string>> vars = {
      {"RANK", std::to_string(c.rank)},
      {"WORLD_SIZE", std::to_string(o_.nnodes * p)},
      {"LOCAL_RANK", std::to_string(c.local)},
      {"LOCAL_WORLD_SIZE", std::to_string(p)},
      {"GROUP_RANK", std::to_string(o_.node_rank)},
      {"MASTER_ADDR", o_.master_host},
      {"MASTER_PORT", std::to_string(master_port_)},
      {"TESSEL_JOB_TOKEN", o_.token},
      {"TESSEL_NNODES", std::to_string(o_.nnodes)},
      {"TESSEL_TIMEOUT_S", fmt::format("{:.3f}", static_cast<double>(o_.timeout.count()) / 1000)},
      {"TESSEL_HEARTBEAT_MS", std::to_string(timing_.interval.count())},
      {"TESSEL_RESTART_COUNT", std::to_string(o_.restart_count)},
      {"TESSEL_STORE_PREFIX", round_ != nullptr ? round_->prefix : ""},
      {"TESSEL_ELASTIC", round_ != nullptr ? fmt::format("{}:{}", o_.min_nodes, o_.max_nodes) : ""},
      {"TESSEL_ELASTIC_ROUND", round_ != nullptr ? std::to_string(round_->number) : ""},
  };
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view kv(*e);
    const std::string_view name = kv.substr(0, kv.find('='));
    bool ours = false;
    for (const auto& [k, v] : vars) ours = ours || name == k;
    if (!ours) env.emplace_back(kv);
  }
  for (const auto& [k, v] : vars) env.push_back(k + "=" + v);
  std::vector<char*> envp, argv;
  for (std::string& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = o_.command;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);

  auto [out_r, out_w] = net::make_pipe();
  auto [err_r, err_w] = net::make_pipe();
  int exec_pipe[2];  // blocking, close-on-exec: EOF means exec succeeded
  TESSEL_CHECK(::pipe2(exec_pipe, O_CLOEXEC) == 0, "tessel launch: cannot create a pipe: {}", std::strerror(errno));
  net::Fd exec_r(exec_pipe[0]), exec_w(exec_pipe[1]);
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  // The child writes to blocking pipes; only the launcher's ends are non-blocking.
  ::fcntl(out_w.get(), F_SETFL, 0);
  ::fcntl(err_w.get(), F_SETFL, 0);

  const pid_t launcher_pid = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    // Should the launcher itself be SIGKILLed, its processes must not live on as orphans
    // (stuck in a collective forever): the kernel kills them when the launcher dies.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher_pid) ::_exit(127);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE, SIGHUP, SIGQUIT}) ::sigaction(sig, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    // stdin is /dev/null: a process in its own group reading the terminal would be stopped.
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(out_w.get(), 1);
    ::dup2(err_w.get(), 2);
    ::execvpe(argv[0], argv.data(), envp.data());
    const int e = errno;
    [[maybe_unused]] ssize_t k = ::write(exec_w.get(), &e, sizeof e);
    ::_exit(127);
  }
  const int fork_errno = errno;
  if (devnull >= 0) ::close(devnull);
  if (pid < 0) return fmt::format("{}: cannot start a process: fork failed: {}", who(c.rank), std::strerror(fork_errno));
  ::setpgid(pid, pid);  // also here, so the group exists before any killpg
  c.pid = pid;
  c.running = true;
  exec_w.reset();
  out_w.reset();
  err_w.reset();
  int child_errno = 0;
  std::size_t got = 0;
  while (got < sizeof child_errno) {
    const ssize_t k = ::read(exec_r.get(), reinterpret_cast<char*>(&child_errno) + got, sizeof child_errno - got);
    if (k > 0) got += static_cast<std::size_t>(k);
    else if (!(k < 0 && errno == EINTR)) break;
  }
  if (got == sizeof child_errno) {
    while (::waitpid(pid, &c.status, 0) < 0 && errno == EINTR) {
    }
    c.running = false;
    c.spawn_failed = true;
    return fmt::format("{}: cannot run '{}': {}", who(c.rank), o_.command[0], std::strerror(child_errno));
  }
  c.out = Stream{std::move(out_r), 1, {}};
  c.err = Stream{std::move(err_r), 2, {}};
  return "";
}

void Launcher::supervise() {
  std::vector<pollfd> fds;
  std::vector<Stream*> streams;
  std::vector<const Child*> owners;
  std::optional<Deadline> drain_until;
  while (true) {
    on_signals();
    reap();
    if (!stopping_) {
      for (const Child& c : children_) {
        if (!c.running && c.pid > 0 && !c.spawn_failed && c.status != 0) {
          fail(fmt::format("{} {}", who(c.rank), describe_status(c.status)), /*local=*/true);
          break;
        }
      }
    }
    if (!stopping_) watch_store();
    if (!stopping_) watch_heartbeats();
    if (stopping_ && !killed_ && Clock::now() >= kill_at_) kill_all(SIGKILL);

    if (all_exited()) {
      if (!drain_until) {
        // Grandchildren left in a stopped job's groups would keep the pipes open.
        if (stopping_) kill_all(SIGKILL);
        drain_until = net::deadline_after(kDrain);
      }
      bool open = false;
      for (const Child& c : children_) open = open || c.out.fd || c.err.fd;
      if (!open || Clock::now() >= *drain_until) break;
    }

    fds.clear();
    streams.clear();
    owners.clear();
    fds.push_back({signals_.fd(), POLLIN, 0});
    for (Child& c : children_) {
      for (Stream* s : {&c.out, &c.err}) {
        if (!s->fd) continue;
        fds.push_back({s->fd.get(), POLLIN, 0});
        streams.push_back(s);
        owners.push_back(&c);
      }
    }
    const int r = ::poll(fds.data(), fds.size(), static_cast<int>(kStorePoll.count()));
    if (r < 0 && errno != EINTR) TESSEL_THROW("tessel launch: poll failed: {}", std::strerror(errno));
    for (std::size_t i = 0; r > 0 && i < streams.size(); ++i)
      if (fds[i + 1].revents != 0) forward(*streams[i], fmt::format("[rank {}] ", owners[i]->rank));
  }
  for (Child& c : children_) {
    const std::string prefix = fmt::format("[rank {}] ", c.rank);
    for (Stream* s : {&c.out, &c.err}) {
      if (s->fd) forward(*s, prefix);
      flush_partial(*s, prefix);
      s->fd.reset();
    }
  }
}

// Reads what is available (a bounded amount, so one chatty process cannot starve the loop)
// and writes whole lines with the rank prefix; at EOF, writes the last partial line and
// closes the stream.
void Launcher::forward(Stream& s, const std::string& prefix) {
  char buf[65536];
  for (int reads = 0; s.fd && reads < 16; ++reads) {
    const ssize_t k = ::read(s.fd.get(), buf, sizeof buf);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (k <= 0) {
      flush_partial(s, prefix);
      s.fd.reset();
      return;
    }
    s.partial.append(buf, static_cast<std::size_t>(k));
    std::string lines;
    std::size_t start = 0;
    while (true) {
      const std::size_t nl = s.partial.find('\n', start);
      if (nl == std::string::npos) break;
      lines += prefix;
      lines.append(s.partial, start, nl + 1 - start);
      start = nl + 1;
    }
    s.partial.erase(0, start);
    if (s.partial.size() >= kMaxLine) {
      lines += prefix + s.partial + "\n";
      s.partial.clear();
    }
    write_all(s.dest, lines);
  }
}

void Launcher::flush_partial(Stream& s, const std::string& prefix) {
  if (s.partial.empty()) return;
  write_all(s.dest, prefix + s.partial + "\n");
  s.partial.clear();
}

void Launcher::reap() {
  for (Child& c : children_) {
    if (!c.running) continue;
    int status = 0;
    const pid_t r = ::waitpid(c.pid, &status, WNOHANG);
    if (r == c.pid) {
      c.running = false;
      c.status = status;
    } else if (r < 0 && errno == ECHILD) {
      c.running = false;  // reaped elsewhere; its fate is unknown
      c.status = -1;
    }
  }
}

void Launcher::begin_stop() {
  if (stopping_) return;
  stopping_ = true;
  kill_at_ = net::deadline_after(grace_);
  for (Child& c : children_) c.stopped_by_us = c.running;
  kill_all(SIGTERM);
}

void Launcher::kill_all(int sig) {
  if (sig == SIGKILL) killed_ = true;
  for (Child& c : children_) {
    if (c.pid <= 0) continue;
    if (::killpg(c.pid, sig) != 0 && c.running) ::kill(c.pid, sig);
    // A stopped process (SIGSTOP, a debugger's) acts on SIGTERM only once it runs again.
    if (sig == SIGTERM && ::killpg(c.pid, SIGCONT) != 0 && c.running) ::kill(c.pid, SIGCONT);
  }
}

// "T" (stopped), "R", "S", ... from /proc/<pid>/stat; "" when unreadable.
std::string process_state(pid_t pid) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string stat;
  std::getline(f, stat);
  const std::size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() ? stat.substr(paren + 2, 1) : "";
}

// This node's running processes that beat and then fell silent fail the job. A silent process
// is stopped, frozen or starved; its peers would wait for it until their collectives time out.
void Launcher::watch_heartbeats() {
  if (store_lost_ || !store_) return;
  const Deadline now = Clock::now();
  if (now < next_rank_check_) return;
  next_rank_check_ = now + timing_.interval;
  std::vector<int> ranks;
  for (const Child& c : children_)
    if (c.running) ranks.push_back(c.rank);
  std::vector<HeartbeatMonitor::Silent> silent;
  try {
    silent = ranks_watch_->poll(*ranks_store_, ranks);
  } catch (const CommError& e) {
    store_lost_ = true;
    fail(fmt::format("node {} lost the job's store at {}: {}", o_.node_rank, store_where_, e.what()), /*local=*/true);
    return;
  }
  if (silent.empty()) return;
  const HeartbeatMonitor::Silent& s = silent.front();
  std::string state;
  for (const Child& c : children_)
    if (c.rank == s.rank && process_state(c.pid) == "T") state = "; the process is stopped (e.g. by SIGSTOP)";
  fail(fmt::format("{} stopped responding: no heartbeat for {:.1f} s (the limit for --timeout {:.0f} s is {:.1f} s){}; "
                   "its last heartbeat (#{}) said: {}",
                   who(s.rank), static_cast<double>(s.silent.count()) / 1000,
                   static_cast<double>(o_.timeout.count()) / 1000, static_cast<double>(timing_.silence.count()) / 1000,
                   state, s.last.count, s.last.describe()),
       /*local=*/true);
}

void Launcher::on_signals() {
  for (int sig : signals_.take()) {
    if (sig != SIGINT && sig != SIGTERM) continue;  // SIGCHLD: reap() runs every round anyway
    ++signals_seen_;
    if (interrupted_ != 0) {
      kill_all(SIGKILL);  // a second Ctrl-C does not wait for the grace period
      continue;
    }
    interrupted_ = sig;
    const std::string msg = fmt::format("node {}'s launcher was interrupted by {}", o_.node_rank, signal_name(sig));
    if (failure_.empty()) fail(msg, /*local=*/true);
    begin_stop();
  }
}

// Records the job's failure, publishes it to the other nodes (the first one wins in the
// store) and starts stopping this node's processes.
void Launcher::fail(const std::string& message, bool local) {
  // A planned stop of an elastic round (to grow) gives the processes time to save a checkpoint.
  if (round_ != nullptr && !stopping_ && store_ && !store_lost_) {
    try {
      if (store_->check({round_->prefix + "/grow"})) grace_ = std::max(o_.kill_grace, o_.timeout);
    } catch (const CommError&) {
    }
  }
  if (failure_.empty()) {
    failure_ = message;
    local_failure_ = local;
    // Said at once: stopping the other processes may take up to --kill-grace.
    say(fmt::format("tessel launch: {}; stopping the job", message));
  }
  if (local && store_ && !store_lost_) {
    try {
      store_->compare_set(failed_key(), "", message);
    } catch (const CommError&) {
      store_lost_ = true;
    }
  }
  begin_stop();
}

// Polled while the job runs: another node's failure, heartbeats, a lost store.
void Launcher::watch_store() {
  if (store_lost_ || !store_) return;
  const Deadline now = Clock::now();
  if (now < next_store_poll_) return;
  next_store_poll_ = now + kStorePoll;
  try {
    if (store_->check({failed_key()})) {
      fail(store_->get(failed_key(), Millis(5000)), /*local=*/false);
      return;
    }
    if (round_ != nullptr && round_->membership_change && o_.node_rank == 0) {
      const std::string change = round_->membership_change();
      if (!change.empty()) {
        store_->set(round_->prefix + "/grow", change);
        fail(change, /*local=*/true);
        return;
      }
    }
    if (now < next_heartbeat_ || o_.nnodes == 1) return;
    next_heartbeat_ = now + kHeartbeat;
    if (o_.node_rank != 0) {
      store_->add(node_key("heartbeat", o_.node_rank), 1);
      return;
    }
    if (!joined_) return;  // nodes that have not joined yet send no heartbeat
    for (int r = 1; r < o_.nnodes; ++r) {
      Beat& b = beats_[static_cast<std::size_t>(r)];
      if (b.finished) continue;
      if (store_->check({node_key("done", r)}) || store_->check({node_key("stopped", r)})) {
        b.finished = true;
        continue;
      }
      const int64_t v = store_->add(node_key("heartbeat", r), 0);
      if (v != b.value) {
        b.value = v;
        b.changed = now;
      } else if (now - b.changed >= kHeartbeatTimeout) {
        fail(fmt::format("node {}'s launcher stopped responding (no heartbeat for {} s)", r,
                         kHeartbeatTimeout.count() / 1000),
             /*local=*/true);
        return;
      }
    }
  } catch (const CommError& e) {
    store_lost_ = true;
    fail(fmt::format("node {} lost the job's store at {} (node 0's launcher): {}", o_.node_rank, store_where_, e.what()),
         /*local=*/true);
  }
}

// Polls `done` every kStorePoll until it holds, `deadline` passes, the launcher is
// interrupted, or the job fails elsewhere. Store errors count as failures.
Launcher::WaitEnd Launcher::wait_until(const std::function<bool()>& done, Deadline deadline) {
  while (true) {
    on_signals();
    if (interrupted_ != 0) return WaitEnd::interrupted;
    try {
      if (done()) return WaitEnd::done;
    } catch (const CommError& e) {
      store_lost_ = true;
      fail(fmt::format("node {} lost the job's store at {}: {}", o_.node_rank, store_where_, e.what()), true);
      return WaitEnd::failed;
    }
    next_store_poll_ = Deadline{};
    watch_store();
    if (!failure_.empty()) return WaitEnd::failed;
    if (Clock::now() >= deadline) return WaitEnd::timeout;
    pollfd p{signals_.fd(), POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::min(kStorePoll, net::time_left(deadline)).count()));
  }
}

void Launcher::report_fates() {
  for (const Child& c : children_) {
    if (local_failure_ && failure_.rfind(who(c.rank) + " ", 0) == 0) continue;  // the failure itself
    if (c.pid <= 0) {
      say(fmt::format("  {} was not started", who(c.rank)));
    } else if (c.spawn_failed) {
      continue;
    } else if (c.status == -1) {
      say(fmt::format("  {} ended; its exit status was lost", who(c.rank)));
    } else {
      say(fmt::format("  {} {}{}", who(c.rank), describe_status(c.status),
                      c.stopped_by_us ? " after the launcher stopped it" : " before the job was stopped"));
    }
  }
}

// Reports the outcome, coordinates the end with the other nodes and returns the status.
int Launcher::finish() {
  if (failure_.empty() && interrupted_ == 0) {
    if (o_.node_rank != 0) {
      try {
        store_->set(node_key("done", o_.node_rank), "0");
      } catch (const CommError& e) {
        say(fmt::format("warning: could not tell node 0 that node {} is done: {}", o_.node_rank, e.what()));
      }
      return 0;
    }
    // Node 0 hosts the store: keep it up until every node is done.
    auto all_done = [&] {
      for (int r = 1; r < o_.nnodes; ++r)
        if (!beats_[static_cast<std::size_t>(r)].finished && !store_->check({node_key("done", r)})) return false;
      return true;
    };
    if (o_.nnodes == 1 || wait_until(all_done, Deadline::max()) == WaitEnd::done) return 0;
    say(fmt::format("error: {}", failure_));
    say("  every rank of node 0 had exited with code 0");
  } else if (interrupted_ != 0) {
    std::string ranks;
    for (const Child& c : children_)
      if (c.stopped_by_us) ranks += (ranks.empty() ? "" : ", ") + std::to_string(c.rank);
    say(fmt::format("error: interrupted by {}; {}", signal_name(interrupted_),
                    ranks.empty() ? std::string("no process was running") : "stopped rank(s) " + ranks));
  } else {
    say(fmt::format("error: {}", failure_));
    report_fates();
  }
  // An elastic job's store outlives the round: the other nodes read the failure there later.
  if (store_ && !store_lost_ && joined_ && round_ == nullptr) {
    try {
      if (o_.node_rank != 0) {
        store_->set(node_key("stopped", o_.node_rank), "1");
      } else if (o_.nnodes > 1) {
        // Keep the store up a little so the other nodes read the failure, not a lost store.
        auto acked = [&] {
          for (int r = 1; r < o_.nnodes; ++r)
            if (!store_->check({node_key("stopped", r)}) && !store_->check({node_key("done", r)})) return false;
          return true;
        };
        const Deadline until = net::deadline_after(grace_ + kAckWait);
        const int seen = signals_seen_;
        while (!acked() && Clock::now() < until && signals_seen_ == seen) {
          on_signals();
          pollfd p{signals_.fd(), POLLIN, 0};
          ::poll(&p, 1, static_cast<int>(kStorePoll.count()));
        }
      }
    } catch (const CommError&) {
    }
  }
  // The shell's convention for a process ended by a signal: 130 for SIGINT, 143 for SIGTERM.
  return interrupted_ != 0 ? 128 + interrupted_ : 1;
}

}  // namespace

JobStore open_job_store(const LaunchOptions& o, bool host, std::size_t max_clients, const std::string& who,
                        const std::function<bool()>& interrupted) {
  JobStore js;
  std::string connect_host = o.master_host;
  if (host) {
    TcpStoreServer::Options so{
        .host = o.master_host, .port = o.master_port, .token = o.token, .max_connections = 4096 + max_clients};
    // TESSEL_STORE_QUOTA_MB: the job's store data quota in MiB (docs/comm.md, "Store limits").
    if (const char* q = std::getenv("TESSEL_STORE_QUOTA_MB"); q != nullptr && *q != '\0') {
      char* end = nullptr;
      const unsigned long long mb = std::strtoull(q, &end, 10);
      TESSEL_CHECK_AS(InputError, end != q && *end == '\0' && mb >= 1 && mb <= (1ull << 20),
                      "TESSEL_STORE_QUOTA_MB must be a whole number of MiB from 1 to 1048576, got '{}'", q);
      so.quota_bytes = static_cast<std::size_t>(mb) << 20;
    }
    js.server = std::make_unique<TcpStoreServer>(so);
    js.port = js.server->port();
    if (connect_host == "0.0.0.0" || connect_host.empty()) connect_host = "127.0.0.1";
    if (connect_host == "::") connect_host = "::1";
  } else {
    js.port = o.master_port;
  }
  js.where = net::host_port(o.master_host, js.port);
  const Deadline deadline = net::deadline_after(o.rendezvous_timeout);
  while (true) {
    try {
      js.client = std::make_shared<TcpStore>(connect_host, js.port, o.token,
                                             std::max(Millis(1), std::min(Millis(1000), net::time_left(deadline))));
      return js;
    } catch (const TimeoutError& e) {
      TESSEL_CHECK_AS(TimeoutError, Clock::now() < deadline,
                      "tessel launch: {} could not reach node 0's store at {} within {} ms: {}", who, js.where,
                      o.rendezvous_timeout.count(), e.what());
    }
    if (interrupted()) return js;
  }
}

int run_attempt(const LaunchOptions& options, SignalScope& signals, const Round* round) {
  Launcher launcher(options, signals, round);
  return launcher.run();
}

std::string job_memory_dir(const std::string& token) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a: a stable name, not a secret
  for (unsigned char c : token) h = (h ^ c) * 0x100000001b3ull;
  return fmt::format("/dev/shm/tessel-{}-{:016x}", ::getuid(), h);
}

namespace {
// Whatever the job left in RAM goes when the job ends.
struct MemoryDirCleanup {
  std::string dir;
  ~MemoryDirCleanup() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};
}  // namespace

int run_launch(const LaunchOptions& options) {
  check_launch_options(options);
  LaunchOptions o = options;
  if (o.timeout.count() == 0) o.timeout = default_timeout();
  o.token = token_of(options, /*warn=*/true);
  o.token_file.clear();
  if (o.token.empty()) o.token = random_token();
  TESSEL_CHECK(o.max_restarts >= 0, "--max-restarts must be 0 or more, got {}", o.max_restarts);
  const MemoryDirCleanup cleanup{job_memory_dir(o.token)};
  if (o.elastic()) return run_elastic(o);
  for (int attempt = 0;; ++attempt) {
    o.restart_count = attempt;
    int rc;
    {
      SignalScope signals;  // destroyed after the launcher, so its children are gone first
      rc = run_attempt(o, signals, nullptr);
    }
    if (rc != 1 || attempt >= o.max_restarts) return rc;
    say(fmt::format("tessel launch: restarting the job ({} of at most {} restarts): every process starts again with "
                    "TESSEL_RESTART_COUNT={}; tessel train --save DIR resumes from its newest complete checkpoint",
                    attempt + 1, o.max_restarts, attempt + 1));
  }
}

}  // namespace tessel
