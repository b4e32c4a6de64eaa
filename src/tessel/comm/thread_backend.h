// The thread backend: N ranks as threads of one process exchanging through shared memory. A
// collective is a rendezvous: every rank posts its buffers, then each rank does its share of
// the work reading (and, for reductions, writing) the other ranks' buffers directly — an
// all_reduce moves each byte once in and once out — and waits until all are done before its
// buffers may change. This is the embedded default on one machine and the workhorse of tests.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "tessel/comm/process_group.h"

namespace tessel {

class ThreadWorld;

struct SpawnOptions {
  Millis timeout = default_timeout();  // of every collective and send/recv
  // Intra-op threads per rank; 0: what the environment asks for (env_num_threads:
  // TESSEL_NUM_THREADS, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS), else the usable cores / world_size
  // (at least 1).
  int threads_per_rank = 0;
  std::vector<int> nodes;            // node of each rank (emulates several hosts); empty: one node
};

// Runs fn(rank) on `world_size` threads. Each thread gets its own rank context (rank, grad
// mode, RNG state, intra-op pool, memory counters) and a thread-backend world group
// (world_group()). When a rank throws, the others' pending communication fails with a
// CommError naming it; after every rank has stopped, the first rank's exception is rethrown.
void spawn(int world_size, const std::function<void(int rank)>& fn, const SpawnOptions& options = {});
// The intra-op threads each of `world_size` spawned ranks gets for SpawnOptions::threads_per_rank.
int spawn_threads_per_rank(int world_size, int threads_per_rank);

// A thread-backend world for `world_size` ranks, for callers managing their own threads;
// make_thread_group(world, rank) gives each rank its handle.
std::shared_ptr<ThreadWorld> make_thread_world(int world_size, Millis timeout = default_timeout(),
                                               std::vector<int> nodes = {});
std::shared_ptr<ProcessGroup> make_thread_group(const std::shared_ptr<ThreadWorld>& world, int rank);
// Makes every pending and future wait in `world` fail with CommError(reason).
void abort_thread_world(const std::shared_ptr<ThreadWorld>& world, const std::string& reason);

}  // namespace tessel
