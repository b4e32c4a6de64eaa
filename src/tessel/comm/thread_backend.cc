// Thread backend: rendezvous-based collectives over shared memory, mailboxes for send/recv,
// and spawn().
#include "tessel/comm/thread_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <thread>

#include "tessel/comm/spin.h"
#include "tessel/comm/world.h"
#include "tessel/core/context.h"
#include "tessel/core/convert.h"
#include "tessel/core/error.h"

namespace tessel {

namespace {
using Clock = std::chrono::steady_clock;

std::string rank_list(const std::vector<int>& ranks) { return fmt::format("[{}]", fmt::join(ranks, ", ")); }
}  // namespace

// What one rank posts for a collective: the op and its arguments.
struct Slot {
  const char* op = "";
  const void* in = nullptr;
  void* out = nullptr;
  int64_t count = 0;
  DType dtype = DType::f32;
  ReduceOp reduce = ReduceOp::sum;
  int root = 0;
  const std::vector<int64_t>* counts = nullptr;   // all_gather_v, reduce_scatter_v, all_to_all_v send
  const std::vector<int64_t>* counts2 = nullptr;  // all_to_all_v recv
};

// The shared state of one group: a three-phase rendezvous (collect, work, leave).
struct Rendezvous {
  enum class Phase { collect, work, leave };
  std::mutex mutex;
  std::condition_variable cv;
  Phase phase = Phase::collect;
  int arrived = 0, finished = 0, left = 0;
  std::vector<Slot> slots;
  std::vector<bool> posted, done;
  uint64_t generation = 0;
  std::string broken;  // non-empty after a failure: every later collective fails at once
  std::atomic<uint64_t> changes{0};  // bumped with every notify: what a spinning waiter polls

  // Wakes the waiters (with `mutex` held).
  void signal() {
    changes.fetch_add(1, std::memory_order_release);
    cv.notify_all();
  }
};

struct MailKey {
  std::string group;
  int src, dst, tag;
  bool operator<(const MailKey& o) const { return std::tie(group, src, dst, tag) < std::tie(o.group, o.src, o.dst, o.tag); }
};

// A posted send or receive waiting for its partner.
struct Posted {
  const void* send_data = nullptr;
  void* recv_data = nullptr;
  size_t bytes = 0;
  std::shared_ptr<CompletionWork> work;
};

class ThreadWorld {
 public:
  ThreadWorld(int size, Millis timeout, std::vector<int> nodes)
      : size_(size),
        timeout_(timeout),
        spin_(spin_budget(size, std::chrono::microseconds{0})),
        nodes_(std::move(nodes)) {
    if (nodes_.empty()) nodes_.assign(static_cast<size_t>(size), 0);
    TESSEL_CHECK(static_cast<int>(nodes_.size()) == size, "thread world: {} node ids for {} ranks", nodes_.size(), size);
  }

  int size() const { return size_; }
  Millis timeout() const { return timeout_; }
  // Waiters poll before blocking only when every rank has a core (comm/spin.h).
  std::chrono::microseconds spin() const { return spin_; }
  int node_of(int world_rank) const { return nodes_[static_cast<size_t>(world_rank)]; }

  std::shared_ptr<Rendezvous> rendezvous(const std::string& group, int size) {
    std::lock_guard lock(mutex_);
    auto& r = groups_[group];
    if (!r) {
      r = std::make_shared<Rendezvous>();
      r->slots.resize(static_cast<size_t>(size));
      r->posted.assign(static_cast<size_t>(size), false);
      r->done.assign(static_cast<size_t>(size), false);
    }
    return r;
  }

  void abort(const std::string& reason) {
    std::vector<std::shared_ptr<Rendezvous>> groups;
    {
      std::lock_guard lock(mutex_);
      if (aborted_.empty()) aborted_ = reason;
      for (auto& [n, g] : groups_) groups.push_back(g);
    }
    for (auto& g : groups) {
      std::lock_guard lock(g->mutex);
      g->signal();
    }
    std::vector<std::shared_ptr<CompletionWork>> pending;
    {
      std::lock_guard lock(mail_mutex_);
      for (auto& [k, q] : mail_)
        for (Posted& p : q) pending.push_back(p.work);
      mail_.clear();
    }
    for (auto& w : pending) w->finish(std::make_exception_ptr(CommError(reason)));
  }
  std::string aborted() {
    std::lock_guard lock(mutex_);
    return aborted_;
  }

  // ---- point to point ----
  WorkPtr post(const MailKey& key, Posted p, bool is_send, const std::string& what, Millis timeout);
  // Withdraws an unmatched posting; false when a partner already took it.
  bool cancel(const MailKey& key, const CompletionWork* work) {
    std::lock_guard lock(mail_mutex_);
    auto it = mail_.find(key);
    if (it == mail_.end()) return false;
    for (auto p = it->second.begin(); p != it->second.end(); ++p)
      if (p->work.get() == work) {
        it->second.erase(p);
        return true;
      }
    return false;
  }

 private:
  int size_;
  Millis timeout_;
  std::chrono::microseconds spin_;
  std::vector<int> nodes_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Rendezvous>> groups_;
  std::string aborted_;
  std::mutex mail_mutex_;
  std::map<MailKey, std::deque<Posted>> mail_;  // unmatched sends or receives, one kind per key at a time
  std::map<MailKey, bool> mail_kind_;           // true: the queue holds sends
};

namespace {

// A send/recv handle: waits with a deadline; on timeout it withdraws the posting (so a late
// partner can never touch the buffer) and names the peer.
class TimedWork final : public Work {
 public:
  TimedWork(std::shared_ptr<CompletionWork> inner, std::string what, Millis timeout, ThreadWorld* world, MailKey key)
      : inner_(std::move(inner)), what_(std::move(what)), deadline_(Clock::now() + timeout), timeout_(timeout),
        world_(world), key_(std::move(key)) {}
  // Sleeps on the completion until the deadline (no polling: with more ranks than cores a
  // polling waiter takes the core from the ranks it waits for). At the deadline the posting is
  // withdrawn, unless a partner took it just then; that partner finishes it at once.
  void wait() override {
    if (inner_->wait_until(deadline_)) return;
    if (world_->cancel(key_, inner_.get()))
      throw TimeoutError(fmt::format("{} timed out after {} ms: the peer never arrived", what_, timeout_.count()));
    inner_->wait();
  }
  bool is_completed() override { return inner_->is_completed(); }

 private:
  std::shared_ptr<CompletionWork> inner_;
  std::string what_;
  Clock::time_point deadline_;
  Millis timeout_;
  ThreadWorld* world_;
  MailKey key_;
};

}  // namespace

WorkPtr ThreadWorld::post(const MailKey& key, Posted p, bool is_send, const std::string& what, Millis timeout) {
  p.work = std::make_shared<CompletionWork>();
  p.work->set_spin(spin());
  auto timed = std::make_shared<TimedWork>(p.work, what, timeout, this, key);
  std::string reason = aborted();
  if (!reason.empty()) {
    p.work->finish(std::make_exception_ptr(CommError(reason)));
    return timed;
  }
  std::optional<Posted> partner;
  {
    std::lock_guard lock(mail_mutex_);
    auto& q = mail_[key];
    if (!q.empty() && mail_kind_[key] != is_send) {
      partner = q.front();
      q.pop_front();
    } else {
      mail_kind_[key] = is_send;
      q.push_back(p);
    }
  }
  if (partner) {
    const Posted& s = is_send ? p : *partner;
    const Posted& r = is_send ? *partner : p;
    std::exception_ptr err;
    if (s.bytes != r.bytes)
      err = std::make_exception_ptr(
          CommError(fmt::format("{}: the send carries {} bytes but the receive expects {}", what, s.bytes, r.bytes)));
    else if (s.bytes > 0)
      std::memcpy(r.recv_data, s.send_data, s.bytes);
    partner->work->finish(err);
    p.work->finish(err);
  }
  return timed;
}

namespace {

class ThreadProcessGroup final : public ProcessGroup {
 public:
  ThreadProcessGroup(std::shared_ptr<ThreadWorld> world, std::string name, int rank, std::vector<int> world_ranks)
      : ProcessGroup(name, rank, world_ranks, nodes_of(*world, world_ranks), world->timeout()), world_(std::move(world)) {
    rdv_ = world_->rendezvous(this->name(), size());
    setup_hierarchy();
  }
  ~ThreadProcessGroup() override { shutdown(); }
  std::string backend() const override { return "thread"; }

 protected:
  // in-place all_reduce: rank r reduces element chunk r over every rank's buffer and writes the
  // result back into every buffer.
  void do_all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op) override {
    Slot s{"all_reduce", nullptr, buf, count, dtype, op};
    collective(s, [&](const std::vector<Slot>& all) {
      check_same(all, [](const Slot& a, const Slot& b) { return a.count == b.count && a.dtype == b.dtype && a.reduce == b.reduce; },
                 "count, dtype and reduce op");
      int64_t lo = split_offset(count, size(), rank()), n = split_size(count, size(), rank());
      std::vector<const void*> srcs;
      std::vector<void*> dsts;
      for (const Slot& o : all) {
        srcs.push_back(o.out);
        dsts.push_back(o.out);
      }
      reduce_ranks(srcs, dsts, lo, lo, n, dtype, op);
    });
  }

  void do_broadcast(void* buf, int64_t count, DType dtype, int root) override {
    Slot s{"broadcast", nullptr, buf, count, dtype, ReduceOp::sum, root};
    collective(s, [&](const std::vector<Slot>& all) {
      check_same(all, [](const Slot& a, const Slot& b) { return a.count == b.count && a.root == b.root && a.dtype == b.dtype; },
                 "count, dtype and root");
      if (rank() != root) copy(buf, all[static_cast<size_t>(root)].out, count, dtype);
    });
  }

  // rank r reduces chunk r over every rank's buffer into the root's buffer.
  void do_reduce(void* buf, int64_t count, DType dtype, ReduceOp op, int root) override {
    Slot s{"reduce", nullptr, buf, count, dtype, op, root};
    collective(s, [&](const std::vector<Slot>& all) {
      check_same(all, [](const Slot& a, const Slot& b) { return a.count == b.count && a.root == b.root && a.dtype == b.dtype && a.reduce == b.reduce; },
                 "count, dtype, reduce op and root");
      int64_t lo = split_offset(count, size(), rank()), n = split_size(count, size(), rank());
      std::vector<const void*> srcs;
      for (const Slot& o : all) srcs.push_back(o.out);
      reduce_ranks(srcs, {all[static_cast<size_t>(root)].out}, lo, lo, n, dtype, op);
    });
  }

  void do_all_gather_v(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype) override {
    Slot s{"all_gather", in, out, 0, dtype, ReduceOp::sum, 0, &counts};
    collective(s, [&](const std::vector<Slot>& all) {
      check_same(all, [](const Slot& a, const Slot& b) { return *a.counts == *b.counts && a.dtype == b.dtype; }, "counts and dtype");
      int64_t at = 0;
      for (int r = 0; r < size(); ++r) {
        copy(static_cast<char*>(out) + at * static_cast<int64_t>(dtype_size(dtype)), all[static_cast<size_t>(r)].in,
             counts[static_cast<size_t>(r)], dtype);
        at += counts[static_cast<size_t>(r)];
      }
    });
  }

  // rank r reduces its segment of every rank's input into its own output.
  void do_reduce_scatter_v(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype, ReduceOp op) override {
    Slot s{"reduce_scatter", in, out, 0, dtype, op, 0, &counts};
    collective(s, [&](const std::vector<Slot>& all) {
      check_same(all, [](const Slot& a, const Slot& b) { return *a.counts == *b.counts && a.dtype == b.dtype && a.reduce == b.reduce; },
                 "counts, dtype and reduce op");
      int64_t lo = 0;
      for (int r = 0; r < rank(); ++r) lo += counts[static_cast<size_t>(r)];
      std::vector<const void*> srcs;
      for (const Slot& o : all) srcs.push_back(o.in);
      reduce_ranks(srcs, {out}, lo, 0, counts[static_cast<size_t>(rank())], dtype, op);
    });
  }

  // The row forms read and write every rank's rows in place (Slot::count carries `rows`).
  void do_all_gather_rows(const void* in, void* out, int64_t rows, const std::vector<int64_t>& widths,
                          DType dtype) override {
    Slot s{"all_gather", in, out, rows, dtype, ReduceOp::sum, 0, &widths};
    collective(s, [&](const std::vector<Slot>& all) {
      check_same(
          all,
          [](const Slot& a, const Slot& b) {
            return *a.counts == *b.counts && a.count == b.count && a.dtype == b.dtype;
          },
          "widths, rows and dtype");
      const int64_t esz = static_cast<int64_t>(dtype_size(dtype));
      int64_t width = 0;
      for (int64_t w : widths) width += w;
      for (int64_t i = 0; i < rows; ++i) {
        int64_t column = 0;
        for (int r = 0; r < size(); ++r) {
          const int64_t w = widths[static_cast<size_t>(r)];
          copy(static_cast<char*>(out) + (i * width + column) * esz,
               static_cast<const char*>(all[static_cast<size_t>(r)].in) + i * w * esz, w, dtype);
          column += w;
        }
      }
    });
  }

  void do_reduce_scatter_rows(const void* in, void* out, int64_t rows, const std::vector<int64_t>& widths, DType dtype,
                              ReduceOp op) override {
    Slot s{"reduce_scatter", in, out, rows, dtype, op, 0, &widths};
    collective(s, [&](const std::vector<Slot>& all) {
      check_same(
          all,
          [](const Slot& a, const Slot& b) {
            return *a.counts == *b.counts && a.count == b.count && a.dtype == b.dtype && a.reduce == b.reduce;
          },
          "widths, rows, dtype and reduce op");
      int64_t width = 0, column = 0;
      for (int r = 0; r < size(); ++r) {
        if (r < rank()) column += widths[static_cast<size_t>(r)];
        width += widths[static_cast<size_t>(r)];
      }
      const int64_t mine = widths[static_cast<size_t>(rank())];
      std::vector<const void*> srcs;
      for (const Slot& o : all) srcs.push_back(o.in);
      for (int64_t i = 0; i < rows && mine > 0; ++i)
        reduce_ranks(srcs, {out}, i * width + column, i * mine, mine, dtype, op);
    });
  }

  void do_all_to_all_v(const void* in, const std::vector<int64_t>& send_counts, void* out,
                       const std::vector<int64_t>& recv_counts, DType dtype) override {
    Slot s{"all_to_all", in, out, 0, dtype, ReduceOp::sum, 0, &send_counts, &recv_counts};
    collective(s, [&](const std::vector<Slot>& all) {
      check_same(all, [](const Slot& a, const Slot& b) { return a.dtype == b.dtype; }, "dtype");
      const int64_t esz = static_cast<int64_t>(dtype_size(dtype));
      int64_t at = 0;
      for (int r = 0; r < size(); ++r) {
        const Slot& peer = all[static_cast<size_t>(r)];
        int64_t n = (*peer.counts)[static_cast<size_t>(rank())];
        TESSEL_CHECK_AS(CommError, n == recv_counts[static_cast<size_t>(r)],
                        "{}: rank {} sends {} elements to rank {}, which expects {}", describe("all_to_all"), r, n, rank(),
                        recv_counts[static_cast<size_t>(r)]);
        int64_t off = 0;
        for (int k = 0; k < rank(); ++k) off += (*peer.counts)[static_cast<size_t>(k)];
        copy(static_cast<char*>(out) + at * esz, static_cast<const char*>(peer.in) + off * esz, n, dtype);
        at += n;
      }
    });
  }

  // Each rank writes its input into the root's output.
  void do_gather(const void* in, void* out, int64_t count, DType dtype, int root) override {
    Slot s{"gather", in, out, count, dtype, ReduceOp::sum, root};
    collective(s, [&](const std::vector<Slot>& all) {
      check_same(all, [](const Slot& a, const Slot& b) { return a.count == b.count && a.root == b.root && a.dtype == b.dtype; },
                 "count, dtype and root");
      copy(static_cast<char*>(all[static_cast<size_t>(root)].out) + rank() * count * static_cast<int64_t>(dtype_size(dtype)),
           in, count, dtype);
    });
  }

  void do_scatter(const void* in, void* out, int64_t count, DType dtype, int root) override {
    Slot s{"scatter", in, out, count, dtype, ReduceOp::sum, root};
    collective(s, [&](const std::vector<Slot>& all) {
      check_same(all, [](const Slot& a, const Slot& b) { return a.count == b.count && a.root == b.root && a.dtype == b.dtype; },
                 "count, dtype and root");
      copy(out,
           static_cast<const char*>(all[static_cast<size_t>(root)].in) + rank() * count * static_cast<int64_t>(dtype_size(dtype)),
           count, dtype);
    });
  }

  void do_barrier() override {
    Slot s{"barrier"};
    collective(s, [](const std::vector<Slot>&) {});
  }

  WorkPtr do_send(const void* buf, size_t bytes, int dst, int tag) override {
    Posted p;
    p.send_data = buf;
    p.bytes = bytes;
    return world_->post(MailKey{name(), rank(), dst, tag}, p, true,
                        fmt::format("{} to rank {} (tag {})", describe("send"), dst, tag), timeout());
  }

  WorkPtr do_recv(void* buf, size_t bytes, int src, int tag) override {
    Posted p;
    p.recv_data = buf;
    p.bytes = bytes;
    return world_->post(MailKey{name(), src, rank(), tag}, p, false,
                        fmt::format("{} from rank {} (tag {})", describe("recv"), src, tag), timeout());
  }

  std::shared_ptr<ProcessGroup> make_group(const std::vector<int>& members, const std::string& name) override {
    const Members m = members_of(members);
    auto g = std::make_shared<ThreadProcessGroup>(world_, name, m.me, m.world_ranks);
    g->set_timeout(timeout());
    return g;
  }

 private:
  static std::vector<int> nodes_of(const ThreadWorld& w, const std::vector<int>& world_ranks) {
    std::vector<int> out;
    for (int r : world_ranks) out.push_back(w.node_of(r));
    return out;
  }

  void copy(void* dst, const void* src, int64_t count, DType dtype) {
    if (count > 0) std::memcpy(dst, src, static_cast<size_t>(count) * dtype_size(dtype));
  }

  template <typename Same>
  void check_same(const std::vector<Slot>& all, Same same, const char* what) {
    const Slot& mine = all[static_cast<size_t>(rank())];
    for (int r = 0; r < size(); ++r) {
      const Slot& o = all[static_cast<size_t>(r)];
      TESSEL_CHECK_AS(CommError, std::strcmp(o.op, mine.op) == 0, "{}: rank {} called {} while rank {} called {}",
                      describe(mine.op), r, o.op, rank(), mine.op);
      TESSEL_CHECK_AS(CommError, same(o, mine), "{}: rank {} and rank {} disagree on the {}", describe(mine.op), r, rank(),
                      what);
    }
  }

  // Posts `mine`, waits for every rank, runs `work` over all posted slots, and waits until every
  // rank is done with the others' buffers.
  void collective(const Slot& mine, const std::function<void(const std::vector<Slot>&)>& work) {
    Rendezvous& z = *rdv_;
    std::unique_lock lock(z.mutex);
    const std::string what = describe(fmt::format("{} (collective #{})", mine.op, sequence()));
    const std::chrono::microseconds spin = world_->spin();
    auto wait_for = [&](auto ready, const char* stage) {
      auto deadline = Clock::now() + timeout();
      while (!ready()) {
        std::string aborted = world_->aborted();
        if (!aborted.empty()) throw CommError(fmt::format("{}: {}", what, aborted));
        if (!z.broken.empty()) throw CommError(fmt::format("{}: {}", what, z.broken));
        if (spin.count() > 0) {  // poll for a change before blocking (comm/spin.h)
          const uint64_t seen = z.changes.load(std::memory_order_acquire);
          lock.unlock();
          const bool changed = spin_until([&] { return z.changes.load(std::memory_order_acquire) != seen; }, spin);
          lock.lock();
          if (changed || ready()) continue;
        }
        if (z.cv.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(100))) ==
                std::cv_status::timeout &&
            Clock::now() >= deadline && !ready()) {
          std::vector<int> missing;
          const std::vector<bool>& flags = std::string(stage) == "arrive" ? z.posted : z.done;
          for (int r = 0; r < size(); ++r)
            if (!flags[static_cast<size_t>(r)]) missing.push_back(ranks()[static_cast<size_t>(r)]);
          z.broken = fmt::format("{} timed out after {} ms waiting for world ranks {} to {}", what, timeout().count(),
                                 rank_list(missing), stage);
          z.signal();
          throw TimeoutError(z.broken);
        }
      }
    };
    wait_for([&] { return z.phase == Rendezvous::Phase::collect && !z.posted[static_cast<size_t>(rank())]; }, "arrive");
    z.slots[static_cast<size_t>(rank())] = mine;
    z.posted[static_cast<size_t>(rank())] = true;
    if (++z.arrived == size()) {
      z.phase = Rendezvous::Phase::work;
      z.signal();
    }
    wait_for([&] { return z.phase != Rendezvous::Phase::collect; }, "arrive");
    lock.unlock();
    try {
      work(z.slots);
    } catch (const std::exception& e) {
      lock.lock();
      z.broken = e.what();
      z.signal();
      throw;
    }
    lock.lock();
    z.done[static_cast<size_t>(rank())] = true;
    if (++z.finished == size()) {
      z.phase = Rendezvous::Phase::leave;
      z.signal();
    }
    wait_for([&] { return z.phase == Rendezvous::Phase::leave; }, "finish");
    if (++z.left == size()) {
      z.arrived = z.finished = z.left = 0;
      z.posted.assign(z.posted.size(), false);
      z.done.assign(z.done.size(), false);
      z.phase = Rendezvous::Phase::collect;
      ++z.generation;
      z.signal();
    }
  }

  std::shared_ptr<ThreadWorld> world_;
  std::shared_ptr<Rendezvous> rdv_;
};

}  // namespace

std::shared_ptr<ThreadWorld> make_thread_world(int world_size, Millis timeout, std::vector<int> nodes) {
  TESSEL_CHECK(world_size >= 1, "thread world: world size must be at least 1, got {}", world_size);
  return std::make_shared<ThreadWorld>(world_size, timeout, std::move(nodes));
}

std::shared_ptr<ProcessGroup> make_thread_group(const std::shared_ptr<ThreadWorld>& world, int rank) {
  std::vector<int> ranks(static_cast<size_t>(world->size()));
  for (int r = 0; r < world->size(); ++r) ranks[static_cast<size_t>(r)] = r;
  return std::make_shared<ThreadProcessGroup>(world, "world", rank, ranks);
}

void abort_thread_world(const std::shared_ptr<ThreadWorld>& world, const std::string& reason) { world->abort(reason); }

int spawn_threads_per_rank(int world_size, int threads_per_rank) {
  if (threads_per_rank > 0) return threads_per_rank;
  if (EnvThreads e = env_num_threads(); e.count > 0) return e.count;
  return std::max(1, usable_cores() / std::max(1, world_size));
}

void spawn(int world_size, const std::function<void(int rank)>& fn, const SpawnOptions& options) {
  auto world = make_thread_world(world_size, options.timeout, options.nodes);
  const int per_rank = spawn_threads_per_rank(world_size, options.threads_per_rank);

  std::mutex error_mutex;
  std::exception_ptr first;
  int first_rank = -1;
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      auto ctx = make_rank_context(r, world_size, per_rank);
      RankContextScope scope(ctx);
      try {
        set_world_group(make_thread_group(world, r));
        fn(r);
      } catch (...) {
        std::exception_ptr e = std::current_exception();
        std::string what = "unknown error";
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& x) {
          what = x.what();
        } catch (...) {
        }
        bool is_first = false;
        {
          std::lock_guard lock(error_mutex);
          if (!first) {
            first = e;
            first_rank = r;
            is_first = true;
          }
        }
        if (is_first) world->abort(fmt::format("rank {} failed: {}", r, what));
      }
      set_world_group(nullptr);  // drop the group (and its worker) before the context goes
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace tessel
