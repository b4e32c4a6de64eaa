// ProcessGroup: the one interface every distributed feature talks through. Byte-level —
// buffers are raw pointers with an element count and a dtype (for reductions) — with a
// blocking and an asynchronous form of every collective. Collectives of one group run in the
// order they were issued, on the group's worker thread, so communication overlaps the
// caller's compute; send/recv are posted directly and complete in any order. Every wait has
// the group's timeout and failures throw CommError naming the group, the operation and the
// ranks that are missing.
//
// Backends (thread_backend.h, gloo_backend.h) implement the do_* primitives; this base class
// provides queuing, statistics, sub-groups and the hierarchical (node-aware) all_reduce and
// all_to_all.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tessel/comm/reduce.h"
#include "tessel/comm/store.h"
#include "tessel/core/device.h"
#include "tessel/core/dtype.h"
#include "tessel/core/reduce_op.h"
#include "tessel/core/shape.h"

namespace tessel {

// A handle on an operation in flight.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until done; rethrows the operation's error.
  virtual void wait() = 0;
  virtual bool is_completed() = 0;
  // Orders the operation before the work enqueued on `stream` after this call. A backend that
  // runs on the device's streams (NCCL) makes the stream wait for an event and returns at
  // once; the backends that move host memory on host threads (thread, Gloo) wait here on the
  // host, so their results are in place before anything later on the stream runs. Rethrows the
  // operation's error.
  virtual void wait_on(Stream stream) {
    (void)stream;
    wait();
  }
};
using WorkPtr = std::shared_ptr<Work>;

// A Work completed by whoever holds it (backends, the group's worker).
class CompletionWork final : public Work {
 public:
  void wait() override;
  // Blocks until done or `deadline`, whichever is first: true when done (rethrowing the
  // operation's error), false at the deadline.
  bool wait_until(std::chrono::steady_clock::time_point deadline);
  bool is_completed() override;
  void finish(std::exception_ptr error = nullptr);
  // Called by wait() before it blocks: lets the group run a job that has not started yet on the
  // waiting thread instead of handing it to its worker (saves two thread wake-ups per call).
  void set_run_inline(std::function<void()> f) { run_inline_ = std::move(f); }
  // wait() polls for completion up to `budget` before it blocks (see comm/spin.h).
  void set_spin(std::chrono::microseconds budget) { spin_ = budget; }

 private:
  std::function<void()> run_inline_;
  std::chrono::microseconds spin_{0};
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::atomic<bool> finished_{false};  // done_, readable without the mutex
  std::exception_ptr error_;
};

// Calls and payload bytes per operation kind, as issued by this rank (payload: the bytes of
// the op's input on this rank — the buffer for all_reduce/broadcast/reduce, the input for
// gathers, scatters, all_to_all, send — and of the output for recv).
struct CommStats {
  struct Entry {
    int64_t calls = 0;
    int64_t bytes = 0;
  };
  std::map<std::string, Entry> ops;
  int64_t total_calls() const;
  std::string str() const;  // "all_gather x2 (96 B), all_reduce x1 (48 B)"
  CommStats& operator+=(const CommStats& other);
  CommStats operator-(const CommStats& other) const;  // entries that end up zero are dropped
};

// One group's counters: its name, its members' world ranks and what this rank issued on it.
struct GroupStats {
  std::string name;
  std::vector<int> ranks;
  CommStats stats;
};

// How all_to_all and all_to_all_v move their data.
//   automatic     hierarchical when the group spans several nodes with the same number (> 1) of
//                 ranks on each, flat otherwise (the default);
//   flat          every rank sends each peer its segment directly (P·(P−1) messages);
//   hierarchical  gather within the node, exchange between nodes, scatter within the node
//                 (ProcessGroup::hierarchical_all_to_all_v); needs such a topology.
// TESSEL_ALL_TO_ALL=auto|flat|hierarchical sets it for every group a process makes (hierarchical:
// in every group whose topology allows it, flat in the others).
enum class AllToAllAlgorithm { automatic, flat, hierarchical };
const char* all_to_all_algorithm_name(AllToAllAlgorithm a);  // "auto", "flat", "hierarchical"
// Parses a name of all_to_all_algorithm_name; throws naming `where` and the choices.
AllToAllAlgorithm parse_all_to_all_algorithm(const std::string& name, const std::string& where);

class ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  virtual ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(ranks_.size()); }
  const std::string& name() const { return name_; }
  // World ranks of the members, indexed by group rank.
  const std::vector<int>& ranks() const { return ranks_; }
  // Node of each member (ranks on one host, or grouped by LOCAL_WORLD_SIZE).
  const std::vector<int>& nodes() const { return nodes_; }
  virtual std::string backend() const = 0;
  Millis timeout() const { return timeout_; }
  void set_timeout(Millis t) { timeout_ = t; }

  // ---- collectives; counts are elements of `dtype` ----
  // buf[count] = reduce over ranks (in place).
  WorkPtr all_reduce_async(void* buf, int64_t count, DType dtype, ReduceOp op);
  // buf[count] = root's buf.
  WorkPtr broadcast_async(void* buf, int64_t count, DType dtype, int root);
  // root's buf[count] = reduce over ranks; other buffers unchanged.
  WorkPtr reduce_async(void* buf, int64_t count, DType dtype, ReduceOp op, int root);
  // out[size * count] = concat over ranks of in[count].
  WorkPtr all_gather_async(const void* in, void* out, int64_t count, DType dtype);
  // out[Σ counts] = concat over ranks r of in[counts[r]].
  // With rows > 1 both buffers are row-major matrices, in [rows, counts[rank]] and
  // out [rows, Σ counts], and rank r's rows land in columns Σ_{q<r} counts[q] onwards: a gather
  // along the inner dim (a tensor dim that is not the outermost), done without repacking where
  // the backend can address the rows in place.
  WorkPtr all_gather_v_async(const void* in, void* out, std::vector<int64_t> counts, DType dtype, int64_t rows = 1);
  // out[count] = reduce over ranks of in[rank*count, (rank+1)*count); in has size*count.
  WorkPtr reduce_scatter_async(const void* in, void* out, int64_t count, DType dtype, ReduceOp op);
  // out[counts[rank]] = reduce over ranks of rank's segment of in[Σ counts].
  // With rows > 1, in is [rows, Σ counts], out is [rows, counts[rank]] and rank's segment is
  // its column range of every row (the inverse layout of all_gather_v's).
  WorkPtr reduce_scatter_v_async(const void* in, void* out, std::vector<int64_t> counts, DType dtype, ReduceOp op,
                                 int64_t rows = 1);
  // out[r*count..] = in[rank*count..] of rank r, both size*count.
  WorkPtr all_to_all_async(const void* in, void* out, int64_t count, DType dtype);
  // Sends in-segment r (send_counts[r] elements, in order) to rank r; receives recv_counts[r]
  // from rank r into out, in rank order.
  WorkPtr all_to_all_v_async(const void* in, std::vector<int64_t> send_counts, void* out,
                             std::vector<int64_t> recv_counts, DType dtype);
  // root's out[size * count] = concat of in[count]; out is ignored elsewhere.
  WorkPtr gather_async(const void* in, void* out, int64_t count, DType dtype, int root);
  // out[count] = root's in[rank*count, ...); in is ignored elsewhere.
  WorkPtr scatter_async(const void* in, void* out, int64_t count, DType dtype, int root);
  WorkPtr barrier_async();
  // Point to point between group ranks; a send matches the recv with the same tag.
  WorkPtr send_async(const void* buf, int64_t count, DType dtype, int dst, int tag = 0);
  WorkPtr recv_async(void* buf, int64_t count, DType dtype, int src, int tag = 0);

  void all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op) { all_reduce_async(buf, count, dtype, op)->wait(); }
  void broadcast(void* buf, int64_t count, DType dtype, int root) { broadcast_async(buf, count, dtype, root)->wait(); }
  void reduce(void* buf, int64_t count, DType dtype, ReduceOp op, int root) {
    reduce_async(buf, count, dtype, op, root)->wait();
  }
  void all_gather(const void* in, void* out, int64_t count, DType dtype) { all_gather_async(in, out, count, dtype)->wait(); }
  void all_gather_v(const void* in, void* out, std::vector<int64_t> counts, DType dtype, int64_t rows = 1) {
    all_gather_v_async(in, out, std::move(counts), dtype, rows)->wait();
  }
  void reduce_scatter(const void* in, void* out, int64_t count, DType dtype, ReduceOp op) {
    reduce_scatter_async(in, out, count, dtype, op)->wait();
  }
  void reduce_scatter_v(const void* in, void* out, std::vector<int64_t> counts, DType dtype, ReduceOp op,
                        int64_t rows = 1) {
    reduce_scatter_v_async(in, out, std::move(counts), dtype, op, rows)->wait();
  }
  void all_to_all(const void* in, void* out, int64_t count, DType dtype) { all_to_all_async(in, out, count, dtype)->wait(); }
  void all_to_all_v(const void* in, std::vector<int64_t> send_counts, void* out, std::vector<int64_t> recv_counts,
                    DType dtype) {
    all_to_all_v_async(in, std::move(send_counts), out, std::move(recv_counts), dtype)->wait();
  }
  void gather(const void* in, void* out, int64_t count, DType dtype, int root) {
    gather_async(in, out, count, dtype, root)->wait();
  }
  void scatter(const void* in, void* out, int64_t count, DType dtype, int root) {
    scatter_async(in, out, count, dtype, root)->wait();
  }
  void barrier() { barrier_async()->wait(); }
  void send(const void* buf, int64_t count, DType dtype, int dst, int tag = 0) {
    send_async(buf, count, dtype, dst, tag)->wait();
  }
  void recv(void* buf, int64_t count, DType dtype, int src, int tag = 0) { recv_async(buf, count, dtype, src, tag)->wait(); }

  // ---- sub-groups (collective over the members of each new group, in the same order) ----
  // Every caller passes disjoint sets of group ranks and gets the group of its set, or null
  // when in none. Only the members of a set need to call: ranks outside it may skip.
  std::shared_ptr<ProcessGroup> split(const std::vector<std::vector<int>>& sets);
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& group_ranks) { return split({group_ranks}); }
  // For a mesh of `shape` laid over this group's ranks in row-major order: the group this rank
  // belongs to along each mesh dim.
  std::vector<std::shared_ptr<ProcessGroup>> mesh_groups(const Shape& shape);

  CommStats stats() const;
  // This group's counters and those of every group split from it (recursively, while they
  // live), this one first: what this rank issued, group by group. The algorithms' own helper
  // groups (the hierarchy's intra- and inter-node groups) are not listed: their work is the call
  // made on this one.
  std::vector<GroupStats> stats_by_group() const;
  void reset_stats();
  // Whether all_reduce uses the hierarchical algorithm (several nodes with several ranks each).
  bool hierarchical() const { return intra_node_ != nullptr; }
  // The all_to_all(_v) algorithm for calls issued from now on (calls already queued keep theirs).
  // Throws for `hierarchical` when the group does not span several nodes with several ranks
  // each (hierarchical() is false).
  void set_all_to_all_algorithm(AllToAllAlgorithm a);
  AllToAllAlgorithm all_to_all_algorithm() const { return all_to_all_algorithm_; }
  // Whether an all_to_all(_v) issued now runs the hierarchical algorithm.
  bool all_to_all_hierarchical() const {
    return intra_node_ != nullptr && all_to_all_algorithm_ != AllToAllAlgorithm::flat;
  }

 protected:
  ProcessGroup(std::string name, int rank, std::vector<int> ranks, std::vector<int> nodes, Millis timeout);
  // Called by backends at the end of their constructor: creates the intra-/inter-node groups
  // when this group spans several nodes (collective).
  void setup_hierarchy();
  // Replaces the node of each member (learnt after creation, e.g. exchanged through the group
  // itself) and sets the hierarchy up for it; collective, before any sub-group is made.
  void set_nodes(std::vector<int> nodes);
  // Stops the worker after the queued operations; backends call it first in their destructor.
  void shutdown();

  // Backend primitives, run on the group's worker thread in issue order.
  virtual void do_all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op) = 0;
  virtual void do_broadcast(void* buf, int64_t count, DType dtype, int root) = 0;
  virtual void do_reduce(void* buf, int64_t count, DType dtype, ReduceOp op, int root) = 0;
  virtual void do_all_gather_v(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype) = 0;
  virtual void do_reduce_scatter_v(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype,
                                   ReduceOp op) = 0;
  virtual void do_all_to_all_v(const void* in, const std::vector<int64_t>& send_counts, void* out,
                               const std::vector<int64_t>& recv_counts, DType dtype) = 0;
  virtual void do_gather(const void* in, void* out, int64_t count, DType dtype, int root) = 0;
  virtual void do_scatter(const void* in, void* out, int64_t count, DType dtype, int root) = 0;
  virtual void do_barrier() = 0;
  // Equal-count forms; backends with faster paths override them.
  virtual void do_all_gather(const void* in, void* out, int64_t count, DType dtype);
  virtual void do_reduce_scatter(const void* in, void* out, int64_t count, DType dtype, ReduceOp op);
  virtual void do_all_to_all(const void* in, void* out, int64_t count, DType dtype);
  // Row forms (rows > 1, `widths` per rank and row; see all_gather_v_async). The defaults repack
  // through a temporary buffer around the contiguous forms; backends that can address every
  // rank's rows in place override them.
  virtual void do_all_gather_rows(const void* in, void* out, int64_t rows, const std::vector<int64_t>& widths,
                                  DType dtype);
  virtual void do_reduce_scatter_rows(const void* in, void* out, int64_t rows, const std::vector<int64_t>& widths,
                                      DType dtype, ReduceOp op);
  // Posted immediately (not queued); the returned work completes when the transfer has.
  virtual WorkPtr do_send(const void* buf, size_t bytes, int dst, int tag) = 0;
  virtual WorkPtr do_recv(void* buf, size_t bytes, int src, int tag) = 0;
  // A backend group over `members` (group ranks of this group, in order) named `name`; called
  // on members only, collectively.
  virtual std::shared_ptr<ProcessGroup> make_group(const std::vector<int>& members, const std::string& name) = 0;
  // What a backend's make_group builds its group from: this rank's place among `members` (-1
  // when it is none of them), their world ranks and their nodes.
  struct Members {
    int me = -1;
    std::vector<int> world_ranks, nodes;
  };
  Members members_of(const std::vector<int>& members) const;

  // "group 'world' all_reduce (collective #3)" — for error messages.
  std::string describe(const std::string& op) const;
  uint64_t sequence() const { return seq_; }

 private:
  WorkPtr enqueue(const char* op, int64_t bytes, std::function<void()> job);
  void worker_loop();
  void run_inline(const CompletionWork* work);
  void run_item(std::function<void()>& job, CompletionWork& work);
  void check_rank(int r, const char* what) const;
  void hierarchical_all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op);
  void hierarchical_all_to_all_v(const void* in, const std::vector<int64_t>& send_counts, void* out,
                                 const std::vector<int64_t>& recv_counts, DType dtype, bool equal_counts);

  std::string name_;
  int rank_;
  std::vector<int> ranks_, nodes_;
  Millis timeout_;
  uint64_t seq_ = 0;                    // collectives issued
  std::map<std::string, int> created_;  // sub-groups made per member list (names them consistently)
  std::vector<std::weak_ptr<ProcessGroup>> subgroups_;  // made by split, for stats_with_subgroups

  mutable std::mutex stats_mutex_;
  CommStats stats_;

  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<CompletionWork>>> queue_;
  std::exception_ptr broken_;  // a failed collective leaves the group unusable
  bool stop_ = false;
  bool running_ = false;  // a job is executing (on the worker or inline on a waiting thread)
  std::thread worker_;

  std::shared_ptr<ProcessGroup> intra_node_, inter_node_;
  // With a hierarchy: node_members_[k][l] is the group rank of local rank l of node k (nodes in
  // node-id order, a node's ranks in group-rank order) — the rank of inter_node_ is k, of
  // intra_node_ l.
  std::vector<std::vector<int>> node_members_;
  AllToAllAlgorithm all_to_all_algorithm_ = AllToAllAlgorithm::automatic;
  std::vector<char> a2a_staging_[3];  // the hierarchical all_to_all's buffers (worker thread only)
};

// Every rank's `mine` (any length), in rank order: an all_gather of the lengths, then of the
// bytes. Collective over `group`.
std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& mine);

}  // namespace tessel
