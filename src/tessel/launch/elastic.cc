// The elastic job (`tessel launch --nnodes MIN:MAX`): rounds over one TCP store that lives as
// long as the job, hosted by the launcher given --node-rank 0.
//
// A round gathers the nodes that are alive and willing, runs the job on them (one attempt,
// attempt.h) and ends when the job is done, when it fails, or when nodes are waiting to join.
// Node ranks are given in the order the nodes joined the round (the store's host opens each
// round and is node 0), so a node's rank may change from one round to the next; the processes
// get the round's WORLD_SIZE and RANK, and `tessel train` re-plans its layout when the world
// size differs from its config's and resumes from the newest complete checkpoint.
//
// Keys (in the job's store):
//   elastic/round               the newest round opened (by node 0)
//   elastic/<k>/joined          counter: each launcher that joins round k takes the next index
//   elastic/<k>/member/<i>      who took index i ("host H, pid P")
//   elastic/<k>/size            the round's node count, set by node 0 when it closes the round:
//                               MAX joined, or MIN and --last-call passed without more; a
//                               launcher whose index is not below it waits for the next round
//   elastic/<k>/grow            why node 0 stopped round k to take in waiting nodes
//   elastic/<k>/launch/...      the attempt's own keys (launcher.h's protocol)
//   elastic/<k>/...             the processes' keys (TESSEL_STORE_PREFIX)
//   elastic/restarts            failed rounds so far (node 0 counts; --max-restarts bounds them)
//   elastic/end                 "done", or why the job ended otherwise
//   elastic/end_seen            counter: launchers that read elastic/end (node 0 keeps the store
//                               up until all have, or a few seconds)
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <optional>

#include "tessel/comm/tcp_store.h"
#include "tessel/core/error.h"
#include "tessel/launch/attempt.h"
#include "tessel/launch/signals.h"

namespace tessel {

namespace {

using net::Clock;
using net::Deadline;

constexpr Millis kPoll{100};
const std::string kRoundKey = "elastic/round";
const std::string kEndKey = "elastic/end";
const std::string kRestartsKey = "elastic/restarts";
const std::string kEndSeenKey = "elastic/end_seen";
constexpr Millis kEndWait{5000};  // node 0 keeps the store up this long at most for the others to read the end

std::string round_key(int k, const std::string& what) { return fmt::format("elastic/{}/{}", k, what); }

class Elastic {
 public:
  explicit Elastic(LaunchOptions o) : o_(std::move(o)) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    me_ = fmt::format("host {}, pid {}", host, ::getpid());
  }
  int run();

 private:
  bool hosts_store() const { return o_.node_rank == 0; }
  void connect();
  // Polls `done` every kPoll until it holds (true) or the launcher is interrupted (false);
  // throws TimeoutError naming `what` once `deadline` passes.
  bool wait_for(const std::function<bool()>& done, Deadline deadline, const std::string& what);
  int run_host();
  // Node 0: publishes how the job ended and keeps the store up until the other launchers of
  // round k (members and waiting nodes) have read it, or kEndWait.
  int end_job(int k, const std::string& how, int rc);
  int run_member();
  // Runs round k on `size` nodes as node `index`; returns the attempt's status.
  int attempt(int k, int size, int index);
  std::optional<std::string> end() { return store_->check({kEndKey}) ? std::optional(store_->get(kEndKey)) : std::nullopt; }
  int64_t joined(int k) { return store_->add(round_key(k, "joined"), 0); }
  bool store_alive() {
    try {
      store_->check({kEndKey});
      return true;
    } catch (const CommError&) {
      return false;
    }
  }

  LaunchOptions o_;
  std::string me_;
  SignalScope signals_;
  int interrupted_ = 0;
  std::unique_ptr<TcpStoreServer> server_;
  std::shared_ptr<TcpStore> store_;
  int port_ = 0;
  std::string where_;
};

void Elastic::connect() {
  // Every round's processes (two connections each) and launchers, with room to spare.
  JobStore js = open_job_store(o_, hosts_store(), 4 * static_cast<std::size_t>(o_.max_nodes) * o_.nproc_per_node,
                               "this launcher", [this] {
                                 for (int sig : signals_.take())
                                   if (sig == SIGINT || sig == SIGTERM) interrupted_ = sig;
                                 return interrupted_ != 0;
                               });
  server_ = std::move(js.server);
  port_ = js.port;
  where_ = js.where;
  store_ = std::move(js.client);
  if (store_) store_->set_timeout(Millis(30'000));
}

bool Elastic::wait_for(const std::function<bool()>& done, Deadline deadline, const std::string& what) {
  while (true) {
    for (int sig : signals_.take())
      if (sig == SIGINT || sig == SIGTERM) interrupted_ = sig;
    if (interrupted_ != 0) return false;
    if (done()) return true;
    TESSEL_CHECK_AS(TimeoutError, Clock::now() < deadline, "tessel launch: {} (waited {} s; --rendezvous-timeout)",
                    what, o_.rendezvous_timeout.count() / 1000);
    pollfd p{signals_.fd(), POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(kPoll.count()));
  }
}

int Elastic::attempt(int k, int size, int index) {
  LaunchOptions o = o_;
  o.nnodes = size;
  o.node_rank = index;
  o.master_port = port_;
  o.restart_count = static_cast<int>(store_->add(kRestartsKey, 0));
  Round round{.store = store_, .port = port_, .number = k, .prefix = fmt::format("elastic/{}", k)};
  if (hosts_store() && size < o_.max_nodes) {
    // Nodes that joined after the round closed are waiting: take them in at a checkpoint.
    round.membership_change = [this, k, size]() -> std::string {
      const int64_t n = std::min<int64_t>(joined(k), o_.max_nodes);
      if (n <= size) return "";
      return fmt::format("membership change: {} node(s) waiting to join; round {} ran on {} of at most {} nodes, so "
                         "the job stops at a checkpoint and grows to {}",
                         n - size, k, size, o_.max_nodes, n);
    };
  }
  return run_attempt(o, signals_, &round);
}

int Elastic::run_host() {
  const int64_t world_max = static_cast<int64_t>(o_.max_nodes) * o_.nproc_per_node;
  for (int k = 0;; ++k) {
    const Deadline opened = Clock::now();
    TESSEL_CHECK(store_->add(round_key(k, "joined"), 1) == 1, "tessel launch: round {} of the elastic job at {} was "
                 "opened by another launcher; only one may be given --node-rank 0", k, where_);
    store_->set(round_key(k, "member/0"), me_);
    store_->set(kRoundKey, std::to_string(k));
    std::optional<Deadline> min_reached;
    int64_t n = 0;
    const bool closed = wait_for(
        [&] {
          n = joined(k);
          if (n >= o_.max_nodes) return true;
          if (n < o_.min_nodes) return false;
          if (!min_reached) min_reached = Clock::now();
          return Clock::now() - *min_reached >= o_.last_call;
        },
        opened + o_.rendezvous_timeout,
        fmt::format("round {} of the elastic job at {}: only {} of at least {} nodes joined", k, where_, n,
                    o_.min_nodes));
    if (!closed) return end_job(k, fmt::format("interrupted by {} on node 0", signal_name(interrupted_)), 128 + interrupted_);
    const int size = static_cast<int>(std::min<int64_t>(n, o_.max_nodes));
    store_->set(round_key(k, "size"), std::to_string(size));
    say(fmt::format("tessel launch: round {}: {} node{} (--nnodes {}:{}{}), world size {}{}; node ranks follow the "
                    "order the nodes joined",
                    k, size, size == 1 ? "" : "s", o_.min_nodes, o_.max_nodes,
                    size == o_.max_nodes ? ", all of them" : fmt::format(", closed {:.1f} s after the minimum joined",
                                                                          o_.last_call.count() / 1000.0),
                    static_cast<int64_t>(size) * o_.nproc_per_node,
                    static_cast<int64_t>(size) * o_.nproc_per_node < world_max
                        ? fmt::format(" of at most {}", world_max)
                        : std::string()));
    const int rc = attempt(k, size, 0);
    if (rc == 0) return end_job(k, "done", 0);
    if (rc != 1) return end_job(k, fmt::format("interrupted on node 0 (exit {})", rc), rc);
    if (store_->check({round_key(k, "grow")})) {
      say(fmt::format("tessel launch: round {} stopped to grow; round {} takes in the waiting nodes", k, k + 1));
      continue;
    }
    const int64_t restarts = store_->add(kRestartsKey, 1);
    if (restarts > o_.max_restarts) {
      say(fmt::format("tessel launch: round {} failed and the job has used its {} restart{} (--max-restarts); "
                      "stopping the job", k, o_.max_restarts, o_.max_restarts == 1 ? "" : "s"));
      return end_job(k, fmt::format("failed in round {} after {} restarts", k, o_.max_restarts), 1);
    }
    say(fmt::format("tessel launch: round {} failed; restart {} of at most {}: round {} gathers the nodes still "
                    "alive (at least {}), and tessel train resumes from its newest complete checkpoint",
                    k, restarts, o_.max_restarts, k + 1, o_.min_nodes));
  }
}

int Elastic::end_job(int k, const std::string& how, int rc) {
  try {
    store_->set(kEndKey, how);
    const Deadline until = net::deadline_after(kEndWait);
    while (Clock::now() < until && store_->add(kEndSeenKey, 0) < joined(k) - 1) {
      pollfd p{signals_.fd(), POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(kPoll.count())) > 0) break;  // a (second) signal: leave now
    }
  } catch (const Error&) {
    // The others find a lost store instead; the job's outcome stands.
  }
  return rc;
}

int Elastic::run_member() {
  int last = -1;  // the newest round this launcher has taken part in or waited through
  const Deadline started = Clock::now();
  Deadline waiting_since = started;
  while (true) {
    int k = -1;
    std::optional<std::string> ended;
    const bool ok = wait_for(
        [&] {
          ended = end();
          if (ended) return true;
          if (!store_->check({kRoundKey})) return false;
          k = std::atoi(store_->get(kRoundKey).c_str());
          return k > last;
        },
        waiting_since + o_.rendezvous_timeout, "no round of the elastic job opened for this node");
    if (!ok) return 128 + interrupted_;
    if (ended) {
      store_->add(kEndSeenKey, 1);
      if (*ended == "done") {
        say(last < 0 ? "tessel launch: the elastic job finished before this node was needed"
                     : "tessel launch: the elastic job finished");
        return 0;
      }
      say(fmt::format("tessel launch: the elastic job ended: {}", *ended));
      return 1;
    }
    const int index = static_cast<int>(store_->add(round_key(k, "joined"), 1) - 1);
    store_->set(round_key(k, "member/" + std::to_string(index)), me_);
    int size = 0;
    if (!wait_for(
            [&] {
              if (!store_->check({round_key(k, "size")})) return false;
              size = std::atoi(store_->get(round_key(k, "size")).c_str());
              return true;
            },
            Clock::now() + o_.rendezvous_timeout, fmt::format("round {} did not close", k)))
      return 128 + interrupted_;
    last = k;
    if (index >= size) {
      say(fmt::format("tessel launch: round {} runs on {} node{} already; this node waits and joins at the next "
                      "membership change (node 0 stops the round at a checkpoint to take it in)",
                      k, size, size == 1 ? "" : "s"));
      waiting_since = Deadline::max() - o_.rendezvous_timeout;  // a waiting node waits as long as the job runs
      continue;
    }
    waiting_since = Clock::now();
    const int rc = attempt(k, size, index);
    if (rc > 1) return rc;  // interrupted here: node 0 sees the failure and goes on without this node
    if (rc == 0 && !store_alive()) {
      // Every process of the job exited 0 and node 0 has closed the store: the job is done.
      say("tessel launch: the elastic job finished (node 0's store has closed)");
      return 0;
    }
    // Success or failure, node 0 decides what follows: the end, or another round.
  }
}

int Elastic::run() {
  connect();
  if (interrupted_ != 0) return 128 + interrupted_;
  return hosts_store() ? run_host() : run_member();
}

}  // namespace

int run_elastic(const LaunchOptions& options) {
  Elastic job(options);
  return job.run();
}

}  // namespace tessel
