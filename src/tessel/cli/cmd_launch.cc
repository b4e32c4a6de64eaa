// `tessel launch`: parses the flags into LaunchOptions and runs the launcher. Flag values
// that cannot describe a job are bad input (exit 2); a job that fails exits 1.
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "tessel/cli/commands.h"
#include "tessel/core/error.h"
#include "tessel/launch/launcher.h"

namespace tessel {

namespace {

constexpr const char* kFooter = R"(Each process gets torchrun's environment:
  RANK              global rank: node_rank * nproc_per_node + LOCAL_RANK
  WORLD_SIZE        nnodes * nproc_per_node
  LOCAL_RANK        rank on this node, 0 .. nproc_per_node-1
  LOCAL_WORLD_SIZE  nproc_per_node
  GROUP_RANK        this node's rank (--node-rank; in an elastic job, its place in the join order)
  MASTER_ADDR       host of node 0's TCP store
  MASTER_PORT       port of node 0's TCP store (the real one when it was chosen freely)
  TESSEL_JOB_TOKEN  the job token that the store requires of every client
  TESSEL_NNODES     number of nodes
  TESSEL_TIMEOUT_S  the job's collective and store timeout (--timeout)
  TESSEL_HEARTBEAT_MS  how often a tessel rank writes its heartbeat to the store
  TESSEL_RESTART_COUNT  0, then 1, 2, ... for each restart (--max-restarts)
Every output line of a process is prefixed with "[rank R] " (stdout to stdout, stderr to
stderr); stdin is /dev/null. When a process exits non-zero or is killed by a signal, every
process of the job, on every node, is stopped (SIGTERM, then SIGKILL after a grace period)
and the failed rank is reported; tessel launch then exits 1. So is a rank whose heartbeat
stops (a stopped or frozen process), with what it was last doing. Ctrl-C (SIGINT) or
SIGTERM stops the job and exits 128 + the signal: 130 or 143. With --max-restarts K, a
failed job is started again, up to K times; `tessel train --save DIR` resumes each restart
from the newest complete checkpoint in DIR, on the same trajectory.

A tessel rank runs its kernels on the cores of its process shared evenly with the node's other
workers (cores / LOCAL_WORLD_SIZE threads, at least 1) unless TESSEL_NUM_THREADS,
OMP_NUM_THREADS or train.threads say otherwise.

Gloo ranks of one node run their collectives through a shared-memory segment (in /dev/shm,
unlinked once mapped), ranks on other nodes over TCP. TESSEL_GLOO_TRANSPORT=tcp in the
environment keeps them all on TCP; TESSEL_GLOO_SHM_SLOT_BYTES sets a rank's slot (4 MiB).

Elastic jobs (--nnodes MIN:MAX) run in rounds over node 0's store: each round takes the
nodes that have joined (MAX, or MIN and then --last-call seconds without more) and gives
them ranks in join order. A failure (a process or a whole node lost) ends the round; the next
one goes on with the nodes still alive, if at least MIN, counting one restart. A node that
joins while a round runs waits; node 0 then stops the round at a checkpoint (SIGTERM: tessel
train saves and exits) and the next round takes it in, without counting a restart. The
processes also get TESSEL_ELASTIC (MIN:MAX), TESSEL_ELASTIC_ROUND and TESSEL_STORE_PREFIX
(the round's namespace in the store); `tessel train` re-plans its layout for a world size
its config does not fit, keeping the global batch. Node 0 hosts the store and must live.

Examples:
  tessel launch --nproc-per-node 4 -- python3 train.py --lr 3e-4
  openssl rand -hex 16 > job.token; chmod 600 job.token     # once, shared with every node
  tessel launch --nnodes 2 --node-rank 0 --master 10.0.0.1:29500 --token-file job.token --nproc-per-node 8 -- ./train
  tessel launch --nnodes 2 --node-rank 1 --master 10.0.0.1:29500 --token-file job.token --nproc-per-node 8 -- ./train
  tessel launch --nnodes 1:4 --node-rank 0 --master 10.0.0.1:29500 --token-file job.token --nproc-per-node 8 \
      --max-restarts 3 -- tessel train cfg.yaml --backend gloo --save /shared/ck    # then, on each other node:
  tessel launch --nnodes 1:4 --node-rank 1 --master 10.0.0.1:29500 --token-file job.token --nproc-per-node 8 \
      --max-restarts 3 -- tessel train cfg.yaml --backend gloo --save /shared/ck)";

// "HOST:PORT", "HOST", "[V6]:PORT" -> host, port (0 when absent).
std::pair<std::string, int> parse_master(const std::string& s) {
  std::string host = s, port;
  if (!s.empty() && s.front() == '[') {
    const std::size_t close = s.find(']');
    if (close == std::string::npos) throw BadInput(fmt::format("--master '{}': missing ']' after the IPv6 address", s));
    host = s.substr(1, close - 1);
    const std::string rest = s.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') throw BadInput(fmt::format("--master '{}': expected ':PORT' after ']'", s));
      port = rest.substr(1);
    }
  } else if (const std::size_t colon = s.rfind(':'); colon != std::string::npos) {
    if (s.find(':') != colon) throw BadInput(fmt::format("--master '{}': write an IPv6 address as [ADDR]:PORT", s));
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
  }
  if (host.empty()) throw BadInput(fmt::format("--master '{}': missing host, e.g. --master 10.0.0.1:29500", s));
  int p = 0;
  if (!port.empty()) {
    char* end = nullptr;
    const long v = std::strtol(port.c_str(), &end, 10);
    if (*end != '\0' || v < 1 || v > 65535)
      throw BadInput(fmt::format("--master '{}': port '{}' is not a number in 1..65535", s, port));
    p = static_cast<int>(v);
  }
  return {host, p};
}

// "N" or "MIN:MAX" -> {MIN, MAX} (MIN == MAX for "N").
std::pair<int, int> parse_nnodes(const std::string& s) {
  auto number = [&](const std::string& t) {
    char* end = nullptr;
    const long v = std::strtol(t.c_str(), &end, 10);
    if (t.empty() || *end != '\0' || v < 1 || v > 1'000'000)
      throw BadInput(fmt::format("--nnodes '{}': expected a positive number of nodes", s));
    return static_cast<int>(v);
  };
  const std::size_t colon = s.find(':');
  if (colon == std::string::npos) return {number(s), number(s)};
  const int lo = number(s.substr(0, colon)), hi = number(s.substr(colon + 1));
  if (lo > hi) throw BadInput(fmt::format("--nnodes {}: MIN is above MAX", s));
  return {lo, hi};
}

Millis seconds_flag(double seconds, const char* flag, bool allow_zero) {
  if (!std::isfinite(seconds) || seconds < 0 || (!allow_zero && seconds == 0) || seconds > 1e9)
    throw BadInput(fmt::format("{} {}: expected a {} number of seconds", flag, seconds, allow_zero ? "non-negative" : "positive"));
  return Millis(static_cast<int64_t>(std::llround(seconds * 1000)));
}

}  // namespace

std::vector<Command> register_launch(CLI::App& app) {
  struct Args {
    std::string nnodes = "1";
    int node_rank = 0;
    std::string master;
    int nproc_per_node = 1;
    std::string token, token_file;
    double rendezvous_timeout = 300;
    double kill_grace = 3;
    double last_call = 3;
    double timeout = 0;
    int max_restarts = 0;
    CLI::Option* timeout_opt = nullptr;
    std::vector<std::string> command;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "launch", "start a job's processes on this node with torchrun's environment; stop them all when one fails");
  cmd->add_option("--nproc-per-node", a->nproc_per_node, "processes to start on this node (one per device)")
      ->required();
  cmd->add_option("--nnodes", a->nnodes,
                  "number of nodes (machines) in the job, each running its own tessel launch; MIN:MAX for an elastic "
                  "job that goes on with at least MIN nodes and takes in up to MAX")
      ->default_str("1");
  cmd->add_option("--node-rank", a->node_rank,
                  "this node's rank, 0 .. nnodes-1; node 0 hosts the job's store. Elastic jobs give ranks in the "
                  "order nodes join: 0 hosts the store, any other value just joins")
      ->default_str("0");
  cmd->add_option("--master", a->master,
                  "HOST:PORT of node 0's store; required with several nodes (default: 127.0.0.1 and a free port)");
  cmd->add_option("--token-file", a->token_file,
                  "file whose first line is the job token that every launcher and process must present to the "
                  "store; required with several nodes, unless TESSEL_JOB_TOKEN is set (default: a random one on a "
                  "single node); at least 128 bits (32 characters) for a --master beyond loopback");
  cmd->add_option("--token", a->token,
                  "the job token itself; discouraged: every local user can read it in `ps` (use TESSEL_JOB_TOKEN "
                  "or --token-file)");
  cmd->add_option("--rendezvous-timeout", a->rendezvous_timeout,
                  "seconds to wait for every node to join before giving up")
      ->default_str("300");
  a->timeout_opt =
      cmd->add_option("--timeout", a->timeout,
                      "seconds a collective or store call of the job waits before it fails (given to the processes "
                      "as TESSEL_TIMEOUT_S); a process whose heartbeat stops for half of it (2 to 30 s) fails the "
                      "job at once, named with what it was doing")
          ->default_str("$TESSEL_TIMEOUT_S, else 300");
  cmd->add_option("--max-restarts", a->max_restarts,
                  "after a failure (a process dies, stops responding or exits non-zero), start every process again, "
                  "up to this many times; each gets TESSEL_RESTART_COUNT, and `tessel train --save DIR` resumes from "
                  "the newest complete checkpoint in DIR")
      ->default_str("0")
      ->check(kNonNegativeCount);
  cmd->add_option("--last-call", a->last_call,
                  "elastic jobs: once MIN nodes have joined a round, seconds to wait for more before it starts")
      ->default_str("3");
  cmd->add_option("--kill-grace", a->kill_grace,
                  "seconds between SIGTERM and SIGKILL when stopping the processes")
      ->default_str("3");
  cmd->add_option("PROGRAM", a->command, "the program to run and its arguments (PROGRAM ARGS...), after --")->required();
  cmd->footer(kFooter);
  return {{cmd, [a] {
             LaunchOptions o;
             const auto [min_nodes, max_nodes] = parse_nnodes(a->nnodes);
             o.nnodes = max_nodes;
             if (min_nodes < max_nodes) {
               o.min_nodes = min_nodes;
               o.max_nodes = max_nodes;
               o.last_call = seconds_flag(a->last_call, "--last-call", true);
               // Any rank but 0 only says "join": elastic ranks follow the join order.
               o.node_rank = a->node_rank == 0 ? 0 : std::min(a->node_rank, max_nodes - 1);
             } else {
               o.node_rank = a->node_rank;
             }
             if (!a->master.empty()) std::tie(o.master_host, o.master_port) = parse_master(a->master);
             o.nproc_per_node = a->nproc_per_node;
             o.command = a->command;
             o.max_restarts = a->max_restarts;
             o.token = a->token;
             o.token_file = a->token_file;
             if (!o.token.empty())
               std::fprintf(stderr, "warning: --token is visible to every user of this machine (in `ps`); set "
                                    "TESSEL_JOB_TOKEN or use --token-file instead\n");
             o.rendezvous_timeout = seconds_flag(a->rendezvous_timeout, "--rendezvous-timeout", false);
             o.kill_grace = seconds_flag(a->kill_grace, "--kill-grace", true);
             try {
               o.timeout = a->timeout_opt->count() > 0 ? timeout_from_seconds(a->timeout, "--timeout") : default_timeout();
             } catch (const Error& e) {
               throw BadInput(e.what());
             }
             try {
               check_launch_options(o);
             } catch (const Error& e) {
               throw BadInput(e.what());
             }
             return run_launch(o);
           }}};
}

}  // namespace tessel
