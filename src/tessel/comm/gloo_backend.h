// The Gloo backend: one process per rank, on one or many machines, over Debian's libgloo (TCP).
// Ranks rendezvous through the Store (the launcher's TCP store); each group is a Gloo context over
// its members. Collectives map to Gloo's algorithms (ring all_reduce and friends); reduce_scatter
// is an all_to_all of segments followed by a local reduction (the same bytes on the wire as a
// ring). The members of a group on one node run every collective through a shared-memory segment
// instead (shm_collectives.h; GlooTransport below). A failed or timed-out collective asks the
// store which ranks reported the same failure, and names the others as missing.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessel/comm/process_group.h"

namespace tessel {

// How the members of a Gloo group on one node move their bytes: `automatic` through a
// shared-memory segment (comm/shm_collectives.h) for every collective (send/recv stay on TCP),
// falling back to TCP where the segment cannot be made; `tcp` always over Gloo's TCP transport.
// Groups spanning nodes use TCP (their intra-node sub-groups may use shared memory).
// TESSEL_GLOO_TRANSPORT=auto|tcp sets it for every group a process makes (default auto).
enum class GlooTransport { automatic, tcp };
// From TESSEL_GLOO_TRANSPORT; throws naming the variable when it is neither auto nor tcp.
GlooTransport gloo_transport_from_env();

struct GlooWorldOptions {
  int rank = 0, size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string token;
  int local_world_size = 0;  // ranks per node (0: one node)
  // This rank's node (any non-negative id; ranks with the same id are one node). -1: RANK /
  // local_world_size, or one node without it. The world exchanges the ids at creation, so
  // every member knows every rank's node whatever order the ranks are numbered in.
  int node = -1;
  std::string bind_host;     // address of this rank's Gloo device ("": 127.0.0.1 for a loopback master, else the hostname)
  Millis timeout = default_timeout();
  Millis heartbeat_interval{0};  // > 0: beat for this rank (heartbeat.h) every interval
  // Every store key of this rank goes under "<store_prefix>/" (an elastic launch gives each
  // round of its long-lived store a namespace of its own); "" for none.
  std::string store_prefix;
  // From RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TESSEL_JOB_TOKEN, LOCAL_WORLD_SIZE,
  // TESSEL_GLOO_HOST, TESSEL_HEARTBEAT_MS and TESSEL_STORE_PREFIX (set by `tessel launch`); the
  // node from TESSEL_NODE (an override: tests emulating nodes, launchers other than tessel's),
  // else GROUP_RANK (`tessel launch`'s --node-rank); throws naming a missing or malformed
  // variable.
  static GlooWorldOptions from_env(Millis timeout);
};

// A new connection to the job's TCP store, in this rank's namespace (store_prefix) unless
// `round_namespace` is false (keys shared by every round of an elastic job).
std::shared_ptr<Store> connect_job_store(const GlooWorldOptions& options, bool round_namespace = true);

// Connects to the job's TCP store and creates the world group (with its heartbeat, when asked).
std::shared_ptr<ProcessGroup> make_gloo_world(const GlooWorldOptions& options);
// A Gloo group over an existing store (several ranks in one process for tests, or an
// embedding application's own rendezvous). `nodes` gives each rank's node (empty: one node);
// its sub-groups inherit `transport` (unset: gloo_transport_from_env()).
std::shared_ptr<ProcessGroup> make_gloo_group(std::shared_ptr<Store> store, int rank, int size, std::vector<int> nodes,
                                              const std::string& bind_host, Millis timeout,
                                              const std::string& name = "world",
                                              std::optional<GlooTransport> transport = std::nullopt);
// What a Gloo group's collectives travel over: "shm", "tcp", or "" before its first collective
// (and for groups of other backends).
std::string gloo_transport_in_use(const ProcessGroup& group);

// Gloo's own ring all_reduce (sum of floats) on the Gloo context of `group`, with no tessel
// code on the path, for benchmarks that compare the two: `classic` runs the algorithm class
// gloo::AllreduceRing<float>, otherwise gloo::allreduce with the ring algorithm and Gloo's
// sum. Throws unless `group` is a Gloo group.
void gloo_direct_ring_all_reduce(ProcessGroup& group, float* buf, int64_t count, bool classic);

}  // namespace tessel
