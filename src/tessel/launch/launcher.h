// `tessel launch`: starts the processes of a job on this node with torchrun's environment
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, plus
// GROUP_RANK and TESSEL_JOB_TOKEN), hosts the TCP store on node 0, prefixes every output line
// with its rank, and when any process fails stops all of them — on every node — and reports
// which rank failed and how. Ctrl-C stops the whole job.
#pragma once

#include <string>
#include <vector>

#include "tessel/comm/store.h"

namespace tessel {

struct LaunchOptions {
  int nnodes = 1;
  int node_rank = 0;
  // An elastic job (`--nnodes MIN:MAX`, MIN < MAX): it runs in rounds, each with every node
  // that has joined, MIN to MAX of them; node ranks are given in the order the nodes joined
  // (the store's host, --node-rank 0, first). A failure starts a new round with the nodes
  // still alive; a node that joins while a round runs is taken in at a checkpoint. nnodes is
  // MAX, or the round's count inside a round (see elastic.cc).
  int min_nodes = 0, max_nodes = 0;
  // With MIN to MAX: once MIN nodes have joined a round, wait this long for more (torchrun's
  // last-call timeout).
  Millis last_call = Millis(3'000);
  bool elastic() const { return max_nodes > min_nodes && min_nodes >= 1; }
  std::string master_host = "127.0.0.1";  // node 0's store address
  int master_port = 0;                    // 0 on a single node: pick a free port
  int nproc_per_node = 1;
  std::vector<std::string> command;       // program and arguments
  // The job token: `token`, else the first line of `token_file`, else $TESSEL_JOB_TOKEN; generated
  // on one node, required for several (at least 128 bits when the store is beyond loopback).
  // Prefer the file or the environment: a command line is visible to every local user in `ps`.
  std::string token;
  std::string token_file;
  Millis rendezvous_timeout = Millis(300'000);
  // The job's collective and store timeout (0: default_timeout()), exported to the processes as
  // TESSEL_TIMEOUT_S; it also sets how soon a silent process is reported (heartbeat.h).
  Millis timeout{0};
  Millis kill_grace = Millis(3'000);      // SIGTERM, then SIGKILL after this long
  // After a failed attempt (a process died, stopped responding or exited non-zero), start every
  // process again, up to this many times (torchrun's --max-restarts). Each attempt's processes
  // get TESSEL_RESTART_COUNT (0, 1, ...); `tessel train --save DIR` then resumes from the newest
  // complete checkpoint in DIR. Every node of a job must give the same number.
  int max_restarts = 0;
  int restart_count = 0;                  // this attempt's (set by run_launch)
};

// Throws Error, naming the `tessel launch` flag, when the options cannot describe a job
// (e.g. --node-rank outside 0..--nnodes-1, several nodes without --master or a token, a
// token under 128 bits for a store beyond loopback, an unreadable --token-file). run_launch calls it first;
// the CLI calls it on its own to tell bad input (exit 2) from a failed run (exit 1).
void check_launch_options(const LaunchOptions& options);

// Runs the job and returns the exit status for `tessel launch`: 0 when every process
// succeeded, 1 when one failed (its rank, node and exit code or signal are reported on
// stderr), 128 + the signal when interrupted (130 for SIGINT, 143 for SIGTERM). Throws Error
// for bad options, CommError/TimeoutError when the store cannot be hosted or reached or the
// rendezvous times out; no process it started outlives the call, whatever the path out of
// it (and, through PR_SET_PDEATHSIG, none outlives a launcher that is itself SIGKILLed). Each process runs in its own process group
// with stdin from /dev/null. For its duration it handles SIGINT, SIGTERM and SIGCHLD and
// ignores SIGPIPE, restoring the previous dispositions on return: one launch per process at
// a time.
//
// Every process gets TESSEL_HEARTBEAT_MS; a tessel rank (init_world) then beats under
// heartbeat/rank/<r> (heartbeat.h), and each launcher watches its own processes: one that
// beat and then fell silent for HeartbeatTiming::for_timeout(timeout).silence (2.5 s for a
// 5 s timeout, 30 s at most) fails the job, named with what its last heartbeat said.
//
// Protocol between the launchers of a job (all keys in node 0's TcpStore):
//   launch/node/<r>       node r joined (rendezvous waits for all of them)
//   launch/failed         the first failure, e.g. "rank 2 (node 1) exited with code 3";
//                         every launcher polls it and stops its processes when it appears
//   launch/heartbeat/<r>  bumped every second by node r != 0; node 0 fails the job when a
//                         node that has not finished stays silent for 30 s
//   launch/done/<r>       node r's processes all exited 0 (node 0 keeps the store up until
//                         every node is done)
//   launch/stopped/<r>    node r has stopped its processes after a failure
//
// With max_restarts, a failed attempt is followed by a new one (a fresh store and rendezvous),
// with a line saying why and how long the failure took to detect; an interrupt is never
// restarted.
int run_launch(const LaunchOptions& options);

// The folder in RAM (tmpfs) where a job's in-memory checkpoints go unless its config names one
// (train.memory_save_every): /dev/shm/tessel-<uid>-<a hash of the job token>. run_launch
// removes it when the job ends, however it ends.
std::string job_memory_dir(const std::string& token);

}  // namespace tessel
