// ProcessGroup: queuing, validation, statistics, sub-groups, the hierarchical all_reduce and
// all_to_all. The byte-level reduction kernels backends share are in reduce.cc.
#include "tessel/comm/process_group.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string_view>

#include "tessel/comm/spin.h"
#include "tessel/core/convert.h"
#include "tessel/core/error.h"
#include "tessel/core/profile.h"
#include "tessel/core/shape.h"

namespace tessel {

// ---------------------------------------------------------------- work and stats

void CompletionWork::wait() {
  while (!wait_until(std::chrono::steady_clock::now() + std::chrono::hours(1))) {
  }
}

bool CompletionWork::wait_until(std::chrono::steady_clock::time_point deadline) {
  if (run_inline_ && !is_completed()) run_inline_();
  if (spin_.count() > 0)
    spin_until([&] { return finished_.load(std::memory_order_acquire) || std::chrono::steady_clock::now() >= deadline; },
               spin_);
  std::unique_lock lock(mutex_);
  if (!done_cv_.wait_until(lock, deadline, [&] { return done_; })) return false;
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool CompletionWork::is_completed() {
  std::lock_guard lock(mutex_);
  return done_;
}

void CompletionWork::finish(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    done_ = true;
    error_ = error;
    finished_.store(true, std::memory_order_release);
  }
  done_cv_.notify_all();
}

CommStats& CommStats::operator+=(const CommStats& other) {
  for (const auto& [op, e] : other.ops) {
    ops[op].calls += e.calls;
    ops[op].bytes += e.bytes;
  }
  return *this;
}

CommStats CommStats::operator-(const CommStats& other) const {
  CommStats out = *this;
  for (const auto& [op, e] : other.ops) {
    Entry& d = out.ops[op];
    d.calls -= e.calls;
    d.bytes -= e.bytes;
    if (d.calls == 0 && d.bytes == 0) out.ops.erase(op);
  }
  return out;
}

int64_t CommStats::total_calls() const {
  int64_t n = 0;
  for (const auto& [op, e] : ops) n += e.calls;
  return n;
}

std::string CommStats::str() const {
  std::string out;
  for (const auto& [op, e] : ops) out += fmt::format("{}{} x{} ({} B)", out.empty() ? "" : ", ", op, e.calls, e.bytes);
  return out.empty() ? "no communication" : out;
}

// ---------------------------------------------------------------- the group

const char* all_to_all_algorithm_name(AllToAllAlgorithm a) {
  switch (a) {
    case AllToAllAlgorithm::automatic: return "auto";
    case AllToAllAlgorithm::flat: return "flat";
    case AllToAllAlgorithm::hierarchical: return "hierarchical";
  }
  return "?";
}

AllToAllAlgorithm parse_all_to_all_algorithm(const std::string& name, const std::string& where) {
  for (AllToAllAlgorithm a : {AllToAllAlgorithm::automatic, AllToAllAlgorithm::flat, AllToAllAlgorithm::hierarchical})
    if (name == all_to_all_algorithm_name(a)) return a;
  TESSEL_THROW("{}: unknown all_to_all algorithm '{}' (expected auto, flat or hierarchical)", where, name);
}

ProcessGroup::Members ProcessGroup::members_of(const std::vector<int>& members) const {
  Members out;
  for (int m : members) {
    if (m == rank_) out.me = static_cast<int>(out.world_ranks.size());
    out.world_ranks.push_back(ranks_[static_cast<size_t>(m)]);
    out.nodes.push_back(nodes_[static_cast<size_t>(m)]);
  }
  return out;
}

ProcessGroup::ProcessGroup(std::string name, int rank, std::vector<int> ranks, std::vector<int> nodes, Millis timeout)
    : name_(std::move(name)), rank_(rank), ranks_(std::move(ranks)), nodes_(std::move(nodes)), timeout_(timeout) {
  if (nodes_.empty()) nodes_.assign(ranks_.size(), 0);
  TESSEL_ASSERT(nodes_.size() == ranks_.size(), "group {}: {} node ids for {} ranks", name_, nodes_.size(), ranks_.size());
  TESSEL_ASSERT(rank_ >= 0 && rank_ < static_cast<int>(ranks_.size()), "group {}: rank {} of {}", name_, rank_, ranks_.size());
  // "hierarchical" from the environment means: wherever the topology allows it, which is what
  // automatic does; only "flat" changes the default.
  if (const char* env = std::getenv("TESSEL_ALL_TO_ALL"); env != nullptr && *env != '\0')
    if (parse_all_to_all_algorithm(env, "environment variable TESSEL_ALL_TO_ALL") == AllToAllAlgorithm::flat)
      all_to_all_algorithm_ = AllToAllAlgorithm::flat;
}

void ProcessGroup::set_all_to_all_algorithm(AllToAllAlgorithm a) {
  TESSEL_CHECK(a != AllToAllAlgorithm::hierarchical || intra_node_ != nullptr,
               "{}: the hierarchical all_to_all needs a group over several nodes with the same number (more than one) "
               "of ranks on each; this group's nodes are [{}]",
               describe("set_all_to_all_algorithm"), fmt::join(nodes_, ", "));
  all_to_all_algorithm_ = a;
}

ProcessGroup::~ProcessGroup() { shutdown(); }

void ProcessGroup::shutdown() {
  {
    std::lock_guard lock(queue_mutex_);
    stop_ = true;
  }
  queue_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

std::string ProcessGroup::describe(const std::string& op) const {
  return fmt::format("group '{}' (rank {} of {}) {}", name_, rank_, size(), op);
}

namespace {

// "(comm OP)", kept for the life of the process (a profile scope holds a view of its name).
std::string_view profile_name(const char* op) {
  static std::mutex mutex;
  static std::set<std::string, std::less<>>* names = new std::set<std::string, std::less<>>();
  std::lock_guard lock(mutex);
  return *names->insert(fmt::format("(comm {})", op)).first;
}

}  // namespace

WorkPtr ProcessGroup::enqueue(const char* op, int64_t bytes, std::function<void()> job) {
  {
    std::lock_guard lock(stats_mutex_);
    CommStats::Entry& e = stats_.ops[op];
    e.calls += 1;
    e.bytes += bytes;
  }
  if (profiling_enabled()) {  // the job's time on the profile as "(comm OP)"
    job = [name = profile_name(op), inner = std::move(job)] {
      ProfileScope scope(name);
      inner();
    };
  }
  auto work = std::make_shared<CompletionWork>();
  std::lock_guard lock(queue_mutex_);
  ++seq_;
  if (broken_) {
    try {
      std::rethrow_exception(broken_);
    } catch (const std::exception& e) {
      work->finish(std::make_exception_ptr(
          CommError(fmt::format("{}: the group is unusable after an earlier failure: {}", describe(op), e.what()))));
    }
    return work;
  }
  queue_.emplace_back(std::move(job), work);
  work->set_run_inline([this, w = work.get()] { run_inline(w); });
  if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
  queue_cv_.notify_one();
  return work;
}

void ProcessGroup::worker_loop() {
  for (;;) {
    std::pair<std::function<void()>, std::shared_ptr<CompletionWork>> item;
    {
      std::unique_lock lock(queue_mutex_);
      queue_cv_.wait(lock, [&] { return stop_ || (!queue_.empty() && !running_); });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    run_item(item.first, *item.second);
  }
}

// Jobs run one at a time in issue order. A thread waiting on the job at the head of the queue
// while nothing runs takes it itself; otherwise it leaves the job to the worker.
void ProcessGroup::run_inline(const CompletionWork* work) {
  std::pair<std::function<void()>, std::shared_ptr<CompletionWork>> item;
  {
    std::lock_guard lock(queue_mutex_);
    if (running_ || queue_.empty() || queue_.front().second.get() != work) return;
    item = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
  }
  run_item(item.first, *item.second);
}

void ProcessGroup::run_item(std::function<void()>& job, CompletionWork& work) {
  std::exception_ptr error;
  {
    std::lock_guard lock(queue_mutex_);
    error = broken_;
  }
  if (!error) {
    try {
      job();
    } catch (...) {
      error = std::current_exception();
      std::lock_guard lock(queue_mutex_);
      if (!broken_) broken_ = error;
    }
  }
  {
    std::lock_guard lock(queue_mutex_);
    running_ = false;
  }
  queue_cv_.notify_one();
  work.finish(error);
}

void ProcessGroup::check_rank(int r, const char* what) const {
  TESSEL_CHECK(r >= 0 && r < size(), "{}: {} {} is not a rank of the group (size {})", describe(what), what, r, size());
}

namespace {
int64_t total(const std::vector<int64_t>& v) {
  int64_t n = 0;
  for (int64_t c : v) {
    TESSEL_CHECK(c >= 0, "negative element count {}", c);
    n += c;
  }
  return n;
}
int64_t nbytes(int64_t count, DType dtype) { return count * static_cast<int64_t>(dtype_size(dtype)); }
}  // namespace

WorkPtr ProcessGroup::all_reduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) {
  check_reducible(dtype, op, describe("all_reduce"));
  return enqueue("all_reduce", nbytes(count, dtype), [=, this] {
    ReduceOp base = op == ReduceOp::avg ? ReduceOp::sum : op;
    if (intra_node_ && count >= intra_node_->size()) hierarchical_all_reduce(buf, count, dtype, base);
    else do_all_reduce(buf, count, dtype, base);
    if (op == ReduceOp::avg) finish_avg(buf, count, dtype, size());
  });
}

WorkPtr ProcessGroup::broadcast_async(void* buf, int64_t count, DType dtype, int root) {
  check_rank(root, "root");
  return enqueue("broadcast", nbytes(count, dtype), [=, this] { do_broadcast(buf, count, dtype, root); });
}

WorkPtr ProcessGroup::reduce_async(void* buf, int64_t count, DType dtype, ReduceOp op, int root) {
  check_rank(root, "root");
  check_reducible(dtype, op, describe("reduce"));
  return enqueue("reduce", nbytes(count, dtype), [=, this] {
    do_reduce(buf, count, dtype, op == ReduceOp::avg ? ReduceOp::sum : op, root);
    if (op == ReduceOp::avg && rank_ == root) finish_avg(buf, count, dtype, size());
  });
}

WorkPtr ProcessGroup::all_gather_async(const void* in, void* out, int64_t count, DType dtype) {
  return enqueue("all_gather", nbytes(count, dtype), [=, this] { do_all_gather(in, out, count, dtype); });
}

WorkPtr ProcessGroup::all_gather_v_async(const void* in, void* out, std::vector<int64_t> counts, DType dtype,
                                         int64_t rows) {
  TESSEL_CHECK(static_cast<int>(counts.size()) == size(), "{}: {} counts for {} ranks", describe("all_gather_v"),
               counts.size(), size());
  TESSEL_CHECK(rows >= 1, "{}: rows must be at least 1, got {}", describe("all_gather_v"), rows);
  total(counts);
  int64_t mine = counts[static_cast<size_t>(rank_)] * rows;
  return enqueue("all_gather", nbytes(mine, dtype), [=, this, c = std::move(counts)] {
    if (rows == 1)
      do_all_gather_v(in, out, c, dtype);
    else
      do_all_gather_rows(in, out, rows, c, dtype);
  });
}

WorkPtr ProcessGroup::reduce_scatter_async(const void* in, void* out, int64_t count, DType dtype, ReduceOp op) {
  check_reducible(dtype, op, describe("reduce_scatter"));
  return enqueue("reduce_scatter", nbytes(count * size(), dtype), [=, this] {
    do_reduce_scatter(in, out, count, dtype, op == ReduceOp::avg ? ReduceOp::sum : op);
    if (op == ReduceOp::avg) finish_avg(out, count, dtype, size());
  });
}

WorkPtr ProcessGroup::reduce_scatter_v_async(const void* in, void* out, std::vector<int64_t> counts, DType dtype,
                                             ReduceOp op, int64_t rows) {
  check_reducible(dtype, op, describe("reduce_scatter_v"));
  TESSEL_CHECK(static_cast<int>(counts.size()) == size(), "{}: {} counts for {} ranks", describe("reduce_scatter_v"),
               counts.size(), size());
  TESSEL_CHECK(rows >= 1, "{}: rows must be at least 1, got {}", describe("reduce_scatter_v"), rows);
  int64_t all = total(counts) * rows, mine = counts[static_cast<size_t>(rank_)] * rows;
  return enqueue("reduce_scatter", nbytes(all, dtype), [=, this, c = std::move(counts)] {
    const ReduceOp base = op == ReduceOp::avg ? ReduceOp::sum : op;
    if (rows == 1)
      do_reduce_scatter_v(in, out, c, dtype, base);
    else
      do_reduce_scatter_rows(in, out, rows, c, dtype, base);
    if (op == ReduceOp::avg) finish_avg(out, mine, dtype, size());
  });
}

WorkPtr ProcessGroup::all_to_all_async(const void* in, void* out, int64_t count, DType dtype) {
  const bool hier = all_to_all_hierarchical();
  return enqueue("all_to_all", nbytes(count * size(), dtype), [=, this] {
    if (!hier) return do_all_to_all(in, out, count, dtype);
    std::vector<int64_t> c(static_cast<size_t>(size()), count);
    hierarchical_all_to_all_v(in, c, out, c, dtype, true);
  });
}

WorkPtr ProcessGroup::all_to_all_v_async(const void* in, std::vector<int64_t> send_counts, void* out,
                                         std::vector<int64_t> recv_counts, DType dtype) {
  TESSEL_CHECK(static_cast<int>(send_counts.size()) == size() && static_cast<int>(recv_counts.size()) == size(),
               "{}: {} send and {} receive counts for {} ranks", describe("all_to_all_v"), send_counts.size(),
               recv_counts.size(), size());
  int64_t sent = total(send_counts);
  total(recv_counts);
  const bool hier = all_to_all_hierarchical();
  return enqueue("all_to_all", nbytes(sent, dtype), [=, this, s = std::move(send_counts), r = std::move(recv_counts)] {
    if (hier) hierarchical_all_to_all_v(in, s, out, r, dtype, false);
    else do_all_to_all_v(in, s, out, r, dtype);
  });
}

WorkPtr ProcessGroup::gather_async(const void* in, void* out, int64_t count, DType dtype, int root) {
  check_rank(root, "root");
  return enqueue("gather", nbytes(count, dtype), [=, this] { do_gather(in, out, count, dtype, root); });
}

WorkPtr ProcessGroup::scatter_async(const void* in, void* out, int64_t count, DType dtype, int root) {
  check_rank(root, "root");
  return enqueue("scatter", rank_ == root ? nbytes(count * size(), dtype) : 0,
                 [=, this] { do_scatter(in, out, count, dtype, root); });
}

WorkPtr ProcessGroup::barrier_async() {
  return enqueue("barrier", 0, [this] { do_barrier(); });
}

WorkPtr ProcessGroup::send_async(const void* buf, int64_t count, DType dtype, int dst, int tag) {
  check_rank(dst, "destination");
  TESSEL_CHECK(dst != rank_, "{}: send to itself", describe("send"));
  {
    std::lock_guard lock(stats_mutex_);
    CommStats::Entry& e = stats_.ops["send"];
    e.calls += 1;
    e.bytes += nbytes(count, dtype);
  }
  return do_send(buf, static_cast<size_t>(nbytes(count, dtype)), dst, tag);
}

WorkPtr ProcessGroup::recv_async(void* buf, int64_t count, DType dtype, int src, int tag) {
  check_rank(src, "source");
  TESSEL_CHECK(src != rank_, "{}: receive from itself", describe("recv"));
  {
    std::lock_guard lock(stats_mutex_);
    CommStats::Entry& e = stats_.ops["recv"];
    e.calls += 1;
    e.bytes += nbytes(count, dtype);
  }
  return do_recv(buf, static_cast<size_t>(nbytes(count, dtype)), src, tag);
}

// Equal-count forms through the general ones.
void ProcessGroup::do_all_gather(const void* in, void* out, int64_t count, DType dtype) {
  do_all_gather_v(in, out, std::vector<int64_t>(static_cast<size_t>(size()), count), dtype);
}
void ProcessGroup::do_reduce_scatter(const void* in, void* out, int64_t count, DType dtype, ReduceOp op) {
  do_reduce_scatter_v(in, out, std::vector<int64_t>(static_cast<size_t>(size()), count), dtype, op);
}
void ProcessGroup::do_all_to_all(const void* in, void* out, int64_t count, DType dtype) {
  std::vector<int64_t> c(static_cast<size_t>(size()), count);
  do_all_to_all_v(in, c, out, c, dtype);
}

namespace {

// Copies between a row-major [rows, Σ widths] matrix and the rank-major packing of its column
// blocks (rank r's block: rows x widths[r], contiguous, in rank order).
enum class Pack { to_blocks, from_blocks };
void repack(const char* src, char* dst, int64_t rows, const std::vector<int64_t>& widths, size_t esz, Pack dir) {
  const int64_t width = total(widths);
  int64_t column = 0, block = 0;
  for (int64_t w : widths) {
    const size_t run = static_cast<size_t>(w) * esz;
    for (int64_t i = 0; i < rows && run > 0; ++i) {
      const size_t matrix_at = static_cast<size_t>(i * width + column) * esz;
      const size_t block_at = static_cast<size_t>(block + i * w) * esz;
      if (dir == Pack::to_blocks)
        std::memcpy(dst + block_at, src + matrix_at, run);
      else
        std::memcpy(dst + matrix_at, src + block_at, run);
    }
    column += w;
    block += rows * w;
  }
}

std::vector<int64_t> times(const std::vector<int64_t>& widths, int64_t rows) {
  std::vector<int64_t> counts;
  for (int64_t w : widths) counts.push_back(w * rows);
  return counts;
}

}  // namespace

void ProcessGroup::do_all_gather_rows(const void* in, void* out, int64_t rows, const std::vector<int64_t>& widths,
                                      DType dtype) {
  const size_t esz = dtype_size(dtype);
  std::vector<char> blocks(static_cast<size_t>(total(widths) * rows) * esz);
  do_all_gather_v(in, blocks.data(), times(widths, rows), dtype);
  repack(blocks.data(), static_cast<char*>(out), rows, widths, esz, Pack::from_blocks);
}

void ProcessGroup::do_reduce_scatter_rows(const void* in, void* out, int64_t rows, const std::vector<int64_t>& widths,
                                          DType dtype, ReduceOp op) {
  const size_t esz = dtype_size(dtype);
  std::vector<char> blocks(static_cast<size_t>(total(widths) * rows) * esz);
  repack(static_cast<const char*>(in), blocks.data(), rows, widths, esz, Pack::to_blocks);
  do_reduce_scatter_v(blocks.data(), out, times(widths, rows), dtype, op);
}

std::vector<GroupStats> ProcessGroup::stats_by_group() const {
  std::vector<GroupStats> out{{name_, ranks_, stats()}};
  std::vector<std::shared_ptr<ProcessGroup>> subs;
  {
    std::lock_guard lock(stats_mutex_);
    for (const auto& w : subgroups_)
      if (auto g = w.lock()) subs.push_back(std::move(g));
  }
  for (const auto& g : subs)
    for (GroupStats& gs : g->stats_by_group()) out.push_back(std::move(gs));
  return out;
}

CommStats ProcessGroup::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

void ProcessGroup::reset_stats() {
  std::lock_guard lock(stats_mutex_);
  stats_ = CommStats{};
}

// ---------------------------------------------------------------- sub-groups

std::shared_ptr<ProcessGroup> ProcessGroup::split(const std::vector<std::vector<int>>& sets) {
  std::set<int> seen;
  const std::vector<int>* mine = nullptr;
  for (const auto& s : sets) {
    TESSEL_CHECK(!s.empty(), "{}: an empty rank set", describe("split"));
    for (int r : s) {
      check_rank(r, "member");
      TESSEL_CHECK(seen.insert(r).second, "{}: rank {} is in two sets", describe("split"), r);
      if (r == rank_) mine = &s;
    }
  }
  if (mine == nullptr) return nullptr;
  // Named by its members and how many times this rank made a group of exactly them, so only
  // the members need to take part: ranks outside a set may skip the call entirely.
  std::string list;
  for (int r : *mine) list += fmt::format("{}{}", list.empty() ? "" : ",", ranks_[static_cast<size_t>(r)]);
  int n = ++created_[list];
  std::shared_ptr<ProcessGroup> g = make_group(*mine, fmt::format("{}/[{}]#{}", name_, list, n));
  {
    std::lock_guard lock(stats_mutex_);
    subgroups_.push_back(g);
  }
  return g;
}

std::vector<std::shared_ptr<ProcessGroup>> ProcessGroup::mesh_groups(const Shape& shape) {
  TESSEL_CHECK(shape_numel(shape) == size(), "{}: mesh shape {} has {} ranks, the group has {}", describe("mesh_groups"),
               shape_str(shape), shape_numel(shape), size());
  Shape strides = contiguous_strides(shape);
  std::vector<std::shared_ptr<ProcessGroup>> out;
  for (size_t d = 0; d < shape.size(); ++d) {
    std::vector<std::vector<int>> sets;
    for (int r = 0; r < size(); ++r) {
      if ((r / strides[d]) % shape[d] != 0) continue;  // r is the first of its group along d
      std::vector<int> g;
      for (int64_t i = 0; i < shape[d]; ++i) g.push_back(static_cast<int>(r + i * strides[d]));
      sets.push_back(std::move(g));
    }
    out.push_back(split(sets));
  }
  return out;
}

// ---------------------------------------------------------------- hierarchy

void ProcessGroup::setup_hierarchy() {
  std::map<int, std::vector<int>> by_node;
  for (int r = 0; r < size(); ++r) by_node[nodes_[static_cast<size_t>(r)]].push_back(r);
  if (by_node.size() < 2) return;
  size_t per = by_node.begin()->second.size();
  for (const auto& [n, rs] : by_node)
    if (rs.size() != per) return;  // uneven nodes: the flat algorithms
  if (per < 2) return;
  std::vector<std::vector<int>> intra, inter(per);
  for (const auto& [n, rs] : by_node) {
    intra.push_back(rs);
    for (size_t i = 0; i < per; ++i) inter[i].push_back(rs[i]);
  }
  intra_node_ = split(intra);
  inter_node_ = split(inter);
  node_members_ = intra;
}

void ProcessGroup::set_nodes(std::vector<int> nodes) {
  TESSEL_ASSERT(nodes.size() == ranks_.size(), "group {}: {} node ids for {} ranks", name_, nodes.size(), ranks_.size());
  TESSEL_ASSERT(intra_node_ == nullptr && created_.empty(), "group {}: set_nodes after sub-groups were made", name_);
  nodes_ = std::move(nodes);
  setup_hierarchy();
}

// reduce_scatter inside the node, all_reduce across nodes, all_gather inside the node.
void ProcessGroup::hierarchical_all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op) {
  const int L = intra_node_->size(), me = intra_node_->rank();
  std::vector<int64_t> counts(static_cast<size_t>(L));
  for (int i = 0; i < L; ++i) counts[static_cast<size_t>(i)] = split_size(count, L, i);
  const size_t esz = dtype_size(dtype);
  std::vector<char> part(static_cast<size_t>(counts[static_cast<size_t>(me)]) * esz);
  intra_node_->reduce_scatter_v(buf, part.data(), counts, dtype, op);
  inter_node_->all_reduce(part.data(), counts[static_cast<size_t>(me)], dtype, op);
  intra_node_->all_gather_v(part.data(), buf, counts, dtype);
}

// The flat all_to_all sends P·(P−1) messages, L² of them between every two nodes of L ranks.
// This one sends L per node pair, each carrying L ranks' data (rank (k, l) is local rank l of
// node k; see node_members_):
//   1. gather within the node — an all_to_all inside node k: (k, l) hands (k, j) every segment
//      it has for local rank j of any node, so (k, j) holds everything node k sends to the
//      j-th ranks of all nodes;
//   2. exchange between nodes — an all_to_all among the j-th ranks: (k, j) sends (m, j) the L
//      segments of node k for (m, j) as one message;
//   3. (m, j) now holds every segment addressed to it, ordered by source node and local rank:
//      put in group-rank order (the scatter is folded into step 1's choice of destinations,
//      so there is no third exchange). With ranks numbered node by node the order is already
//      right and step 2 receives into `out` directly.
// Every byte crosses between nodes once, as in the flat form; inside the node it moves once
// more. With per-rank counts, (k, j) learns how much each (k, l) sends to each (m, j) from a
// small all_to_all of counts inside the node first (its own receive counts say the rest).
//
// Step 2's receives are posted before step 1 starts, as point-to-point receives on the
// inter-node group: a receiver's "ready" notice (Gloo's transport sends data only to a posted
// receive) then crosses the link while the node gathers, instead of after — half a round trip
// between nodes off every call once the gather takes that long. Its sizes come from this rank's
// own receive counts, known up front.
void ProcessGroup::hierarchical_all_to_all_v(const void* in, const std::vector<int64_t>& send_counts, void* out,
                                             const std::vector<int64_t>& recv_counts, DType dtype, bool equal_counts) {
  constexpr int kA2aTag = 0x7a2a;  // the inter-node group carries no other point-to-point traffic
  const int L = intra_node_->size(), N = inter_node_->size(), P = size();
  const size_t esz = dtype_size(dtype), uL = static_cast<size_t>(L), uN = static_cast<size_t>(N);
  auto member = [&](int k, int l) { return node_members_[static_cast<size_t>(k)][static_cast<size_t>(l)]; };
  std::vector<int64_t> send_at(static_cast<size_t>(P) + 1, 0), recv_at(static_cast<size_t>(P) + 1, 0);
  for (size_t r = 0; r < static_cast<size_t>(P); ++r) {
    send_at[r + 1] = send_at[r] + send_counts[r];
    recv_at[r + 1] = recv_at[r] + recv_counts[r];
  }
  // Three staging buffers, kept by the group across calls: fresh ones would be page-faulted in
  // on every call, which at megabytes costs more than the copies themselves.
  auto staging = [&](int i, size_t bytes) {
    std::vector<char>& b = a2a_staging_[static_cast<size_t>(i)];
    if (b.size() < std::max<size_t>(bytes, 1)) b.resize(std::max<size_t>(bytes, 1));
    return b.data();
  };
  // Step 2's receives first (see above): from the j-th rank of node m, the segments of its
  // node's ranks (m, l) for this rank, in l order, into `landing` at node m's place. A fixed
  // tag: the calls on this group run one at a time, each waits for all its transfers.
  bool in_order = true;  // group ranks numbered node by node: received order is group-rank order
  for (int m = 0; m < N && in_order; ++m)
    for (int l = 0; l < L && in_order; ++l) in_order = member(m, l) == m * L + l;
  {  // receiving straight into `out` while `in` is still to be read needs the two apart
    const auto i0 = reinterpret_cast<std::uintptr_t>(in), o0 = reinterpret_cast<std::uintptr_t>(out);
    const size_t in_bytes = static_cast<size_t>(send_at.back()) * esz, out_bytes = static_cast<size_t>(recv_at.back()) * esz;
    if (in_bytes > 0 && out_bytes > 0 && i0 < o0 + out_bytes && o0 < i0 + in_bytes) in_order = false;
  }
  const int k = inter_node_->rank();
  std::vector<int64_t> r2(uN, 0), landing_at(uN + 1, 0);
  for (size_t m = 0; m < uN; ++m) {
    for (size_t l = 0; l < uL; ++l) r2[m] += recv_counts[static_cast<size_t>(member(static_cast<int>(m), static_cast<int>(l)))];
    landing_at[m + 1] = landing_at[m] + r2[m];
  }
  char* const landing = in_order ? static_cast<char*>(out) : staging(2, static_cast<size_t>(recv_at.back()) * esz);
  std::vector<WorkPtr> transfers;
  for (int m = 0; m < N; ++m)
    if (m != k && r2[static_cast<size_t>(m)] > 0)
      transfers.push_back(inter_node_->do_recv(landing + static_cast<size_t>(landing_at[static_cast<size_t>(m)]) * esz,
                                               static_cast<size_t>(r2[static_cast<size_t>(m)]) * esz, m, kA2aTag));

  // mine[j][m]: what this rank sends (m, j); theirs[l][m]: what (k, l) sends (m, this local rank).
  std::vector<int64_t> mine(uL * uN), theirs(uL * uN);
  for (int j = 0; j < L; ++j)
    for (int m = 0; m < N; ++m) mine[static_cast<size_t>(j * N + m)] = send_counts[static_cast<size_t>(member(m, j))];
  if (equal_counts) theirs = mine;  // every segment has the same size
  else intra_node_->all_to_all(mine.data(), theirs.data(), N, DType::i64);

  // 1. Within the node: segments regrouped by destination local rank j, then node m.
  std::vector<int64_t> s1(uL, 0), r1(uL, 0);
  for (size_t j = 0; j < uL; ++j)
    for (size_t m = 0; m < uN; ++m) {
      s1[j] += mine[j * uN + m];
      r1[j] += theirs[j * uN + m];
    }
  const int64_t sent = send_at.back(), held = total(r1);
  char* const packed = staging(0, static_cast<size_t>(sent) * esz);
  char* p = packed;
  for (int j = 0; j < L; ++j)
    for (int m = 0; m < N; ++m) {
      const int r = member(m, j);
      const size_t n = static_cast<size_t>(send_counts[static_cast<size_t>(r)]) * esz;
      if (n > 0) std::memcpy(p, static_cast<const char*>(in) + static_cast<size_t>(send_at[static_cast<size_t>(r)]) * esz, n);
      p += n;
    }
  char* const gathered = staging(1, static_cast<size_t>(held) * esz);
  intra_node_->all_to_all_v(packed, s1, gathered, r1, dtype);

  // 2. Between nodes: gathered is [source l][destination node m]; the exchange sends node m the
  // segments of every l in order, so transpose to [m][l].
  std::vector<int64_t> gathered_at(uL * uN + 1, 0);  // offsets in gathered, [l][m] order
  for (size_t i = 0; i < uL * uN; ++i) gathered_at[i + 1] = gathered_at[i] + theirs[i];
  char* const outgoing = staging(0, static_cast<size_t>(held) * esz);  // packed is no longer needed
  std::vector<int64_t> outgoing_at(uN + 1, 0);
  p = outgoing;
  for (size_t m = 0; m < uN; ++m) {
    for (size_t l = 0; l < uL; ++l) {
      const size_t n = static_cast<size_t>(theirs[l * uN + m]) * esz;
      if (n > 0) std::memcpy(p, gathered + static_cast<size_t>(gathered_at[l * uN + m]) * esz, n);
      p += n;
    }
    outgoing_at[m + 1] = (p - outgoing) / static_cast<std::ptrdiff_t>(esz);
  }
  // What stays on this node goes straight to its place; the rest to the j-th rank of node m
  // (whose receive for it may have been waiting since before step 1).
  const auto uk = static_cast<size_t>(k);
  TESSEL_ASSERT(outgoing_at[uk + 1] - outgoing_at[uk] == r2[uk], "{}: {} elements kept on node {} but {} expected",
                describe("hierarchical all_to_all"), outgoing_at[uk + 1] - outgoing_at[uk], k, r2[uk]);
  if (r2[uk] > 0)
    std::memcpy(landing + static_cast<size_t>(landing_at[uk]) * esz, outgoing + static_cast<size_t>(outgoing_at[uk]) * esz,
                static_cast<size_t>(r2[uk]) * esz);
  for (int m = 0; m < N; ++m) {
    const auto um = static_cast<size_t>(m);
    if (m != k && outgoing_at[um + 1] > outgoing_at[um])
      transfers.push_back(inter_node_->do_send(outgoing + static_cast<size_t>(outgoing_at[um]) * esz,
                                               static_cast<size_t>(outgoing_at[um + 1] - outgoing_at[um]) * esz, m, kA2aTag));
  }
  for (const WorkPtr& t : transfers) t->wait();

  // 3. Into group-rank order.
  if (in_order) return;
  p = landing;
  for (int m = 0; m < N; ++m)
    for (int l = 0; l < L; ++l) {
      const int r = member(m, l);
      const size_t n = static_cast<size_t>(recv_counts[static_cast<size_t>(r)]) * esz;
      if (n > 0) std::memcpy(static_cast<char*>(out) + static_cast<size_t>(recv_at[static_cast<size_t>(r)]) * esz, p, n);
      p += n;
    }
}

std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& mine) {
  const int n = group.size();
  std::vector<int64_t> sizes(static_cast<size_t>(n));
  int64_t my_size = static_cast<int64_t>(mine.size());
  group.all_gather(&my_size, sizes.data(), 1, DType::i64);
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  std::string all(static_cast<size_t>(total), ' ');
  group.all_gather_v(mine.data(), all.data(), sizes, DType::b8);
  std::vector<std::string> out;
  int64_t at = 0;
  for (int64_t s : sizes) {
    out.push_back(all.substr(static_cast<size_t>(at), static_cast<size_t>(s)));
    at += s;
  }
  return out;
}

}  // namespace tessel
