// Collectives through shared memory for the members of a Gloo group that share a node.
//
// Gloo's TCP transport moves every byte between two processes of one machine through the kernel's
// loopback: a socket copy each way, an IO thread polling epoll per process, and the reduction on
// that thread. Measured on 2-process data parallel (issue 25's profile), that cost about 9% of two
// cores and left the ranks idle 4.4% waiting on sockets. Here the members map one POSIX
// shared-memory segment instead: each rank copies its input into its own slot, and after a barrier
// every rank reduces (or copies) its share straight out of the others' slots, on the group's worker
// thread, as the thread backend does between threads (the same rank-order reduction, so both give
// the same bits).
//
// Segment: a header (one cache line per rank: its arrival count, its pid, whether it left) and
// `size` input slots plus one result slot of slot_bytes each. Every collective is a sequence of
// barriers; between two barriers each rank writes only memory no other rank reads in that phase.
// Inputs are written only before a collective's (or a chunk's) first barrier and read only between
// its barriers; the result slot is written only after a first barrier; and every collective ends
// with a barrier after its last read of the inputs. A waiter polls briefly, then sleeps on a futex
// in the segment that each arrival bumps.
//
// Failure: a wait gives up at the group's timeout (TimeoutError naming the ranks that had not
// arrived), when a rank left the group (its destructor says so in the header: a rank that threw),
// when a rank's process is gone (its pid no longer exists), or when a rank gave up (the others stop
// at once instead of at their own timeout).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessel/comm/store.h"
#include "tessel/core/dtype.h"
#include "tessel/core/reduce_op.h"

namespace tessel {

class ShmCollectives {
 public:
  // Collective over the `size` members of a group on one node. Rank 0 creates the segment and
  // publishes its name under `key` in `store`; the others map it; `all_ok(mine)` must return
  // whether every member's `mine` was true (the group's own TCP path answers it). The name is
  // unlinked once everyone has mapped it, so nothing is left in /dev/shm whatever happens next.
  // Returns null on every member when any could not (no shared memory, no room for the segment, a
  // member on another host), saying why in `why_not`. slot_bytes 0: TESSEL_GLOO_SHM_SLOT_BYTES,
  // else 4 MiB.
  static std::unique_ptr<ShmCollectives> connect(Store& store, const std::string& key, int rank, int size,
                                                 Millis timeout, const std::function<bool(bool)>& all_ok,
                                                 size_t slot_bytes = 0, std::string* why_not = nullptr);
  ~ShmCollectives();
  ShmCollectives(const ShmCollectives&) = delete;
  ShmCollectives& operator=(const ShmCollectives&) = delete;

  // The ProcessGroup primitives (counts in elements; `op` is never avg: the group divides).
  void all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op);
  void broadcast(void* buf, int64_t count, DType dtype, int root);
  void all_gather_v(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype);
  void reduce_scatter_v(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype, ReduceOp op);
  void all_to_all_v(const void* in, const std::vector<int64_t>& send_counts, void* out,
                    const std::vector<int64_t>& recv_counts, DType dtype);
  void reduce(void* buf, int64_t count, DType dtype, ReduceOp op, int root);
  void gather(const void* in, void* out, int64_t count, DType dtype, int root);
  void scatter(const void* in, void* out, int64_t count, DType dtype, int root);
  void barrier();

  size_t slot_bytes() const { return slot_bytes_; }
  // Waits give up after `timeout` (the group's).
  void set_timeout(Millis timeout) { timeout_ = timeout; }

 private:
  ShmCollectives(void* base, size_t bytes, int rank, int size, size_t slot_bytes, Millis timeout);
  struct RankLine;
  RankLine& line(int r) const;
  char* slot(int r) const;  // r == size_: the result slot
  // Arrives at the next barrier and waits until every rank has.
  void sync();
  // all_reduce and reduce: the result lands in every rank's buf, or only in root's (root >= 0).
  void reduce_to(void* buf, int64_t count, DType dtype, ReduceOp op, int root);
  // all_gather_v and gather: into every rank's out, or only root's (root >= 0; out ignored
  // elsewhere).
  void gather_to(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype, int root);
  // The largest of every rank's `mine` (exchanged through the header, behind one barrier).
  int64_t max_over_ranks(int64_t mine);
  // Tells the others this rank gave up, then throws CommError (TimeoutError when `timed_out`).
  [[noreturn]] void fail(const std::string& why, bool timed_out = false);

  void* base_;
  size_t bytes_;
  int rank_, size_;
  size_t slot_bytes_;
  Millis timeout_;
  std::chrono::microseconds spin_;  // how long a barrier polls before it sleeps
  uint64_t epoch_ = 0;  // barriers passed (the same on every rank)
};

}  // namespace tessel
