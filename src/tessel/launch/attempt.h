// Internal to `tessel launch` (launcher.cc, elastic.cc, signals.cc): one attempt of a job on
// this node — its processes started, watched and stopped — as a fixed-size job runs it, or as
// one round of an elastic job, and the launcher's signal handling that spans the attempts.
#pragma once

#include <signal.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessel/comm/socket.h"
#include "tessel/comm/tcp_store.h"
#include "tessel/launch/launcher.h"

namespace tessel {

// While one exists, SIGINT, SIGTERM and SIGCHLD write their number to a self-pipe that the
// launcher's poll loops watch, and SIGPIPE is ignored; the previous dispositions come back on
// destruction. One at a time per process.
class SignalScope {
 public:
  SignalScope();
  ~SignalScope();
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

  int fd() const { return read_.get(); }
  // The signals received since the last call (SIGCHLD included).
  std::vector<int> take();

 private:
  net::Fd read_, write_;
  struct sigaction old_[4];  // SIGINT, SIGTERM, SIGCHLD, SIGPIPE as they were
};

// One round of an elastic job: its namespace in the job's long-lived store. The attempt's
// launchers keep their keys under "<prefix>/launch/", its processes every key of theirs
// (TESSEL_STORE_PREFIX) under "<prefix>/".
struct Round {
  std::shared_ptr<TcpStore> store;
  int port = 0;
  int number = 0;
  std::string prefix;  // "elastic/<number>"
  // Polled by the round's node 0 while the processes run: a reason to stop the round for a
  // membership change ("" for none). The stop is planned: the processes get SIGTERM and the
  // job's --timeout to save a checkpoint and exit, and "<prefix>/grow" holds the reason.
  std::function<std::string()> membership_change;
};

// The job's store as a launcher sees it: hosted here when `host` (node 0; room for
// `max_clients` connections), reached as a client either way — in short attempts, so that
// `interrupted()` (which also takes the launcher's signals) is asked while node 0 is not up
// yet. `client` stays null when interrupted first; a store not reached within
// --rendezvous-timeout throws TimeoutError, naming `who`.
struct JobStore {
  std::unique_ptr<TcpStoreServer> server;
  std::shared_ptr<TcpStore> client;
  int port = 0;
  std::string where;  // host:port, for messages
};
JobStore open_job_store(const LaunchOptions& options, bool host, std::size_t max_clients, const std::string& who,
                        const std::function<bool()>& interrupted);

// Runs one attempt: options.nnodes and options.node_rank are this attempt's. Returns 0 when
// every process of the job succeeded, 1 when the attempt failed (or was stopped for a
// membership change), 128 + the signal when interrupted. Without a round, the attempt hosts
// or reaches node 0's store and gathers the nodes itself.
int run_attempt(const LaunchOptions& options, SignalScope& signals, const Round* round);

// The elastic job (options.min_nodes < options.max_nodes): rounds over one store, in
// elastic.cc.
int run_elastic(const LaunchOptions& options);

// Writes a line to stderr (async-signal-safe path of write_all).
void say(const std::string& line);

}  // namespace tessel
