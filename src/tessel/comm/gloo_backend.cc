// Gloo backend.
#include "tessel/comm/gloo_backend.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_ring.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/gather.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "tessel/comm/heartbeat.h"
#include "tessel/comm/shm_collectives.h"
#include "tessel/comm/tcp_store.h"
#include "tessel/core/convert.h"
#include "tessel/core/error.h"

namespace tessel {

namespace {

using Clock = std::chrono::steady_clock;

// Gloo's rendezvous store interface over a tessel Store.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(std::shared_ptr<tessel::Store> base, Millis timeout) : base_(std::move(base)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    base_->set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    std::string v = base_->get(key, timeout_);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { base_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    base_->wait(keys, Millis(timeout.count()));
  }

 private:
  std::shared_ptr<tessel::Store> base_;
  Millis timeout_;
};

// Gloo's reduce signature c = a op b: Gloo's own vectorised kernels for the types it knows,
// ours (bf16 via f32, bool) otherwise.
template <typename T>
gloo::AllreduceOptions::Func gloo_native(ReduceOp op) {
  using Fn = void (*)(void*, const void*, const void*, size_t);
  switch (op) {
    case ReduceOp::max: return static_cast<Fn>(&gloo::max<T>);
    case ReduceOp::min: return static_cast<Fn>(&gloo::min<T>);
    case ReduceOp::prod: return static_cast<Fn>(&gloo::product<T>);
    default: return static_cast<Fn>(&gloo::sum<T>);
  }
}

gloo::AllreduceOptions::Func reduce_fn(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::f32: return gloo_native<float>(op);
    case DType::f64: return gloo_native<double>(op);
    case DType::i32: return gloo_native<int32_t>(op);
    case DType::i64: return gloo_native<int64_t>(op);
    default: break;
  }
  size_t esz = dtype_size(dtype);
  return [=](void* c, const void* a, const void* b, size_t n) {
    if (c != a) std::memmove(c, a, n * esz);
    reduce_into(c, b, static_cast<int64_t>(n), dtype, op);
  };
}

// Gloo sizes buffers through a template type: pick the unsigned integer of the element size.
template <typename F>
void by_element_size(DType dtype, F f) {
  switch (dtype_size(dtype)) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    default: return f(uint64_t{});
  }
}

// Gloo's TCP transport writes to peer sockets without MSG_NOSIGNAL: once a peer has died, a
// write raises SIGPIPE, whose default action kills the whole process before the failure can
// surface as a CommError naming the missing rank. Ignore it (once, only if nobody installed a
// handler), so the write fails with EPIPE and the group reports the dead peer.
void ignore_sigpipe_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
      struct sigaction ign {};
      ign.sa_handler = SIG_IGN;
      ::sigemptyset(&ign.sa_mask);
      ::sigaction(SIGPIPE, &ign, nullptr);
    }
  });
}

std::shared_ptr<gloo::transport::Device> device_for(const std::string& host) {
  ignore_sigpipe_once();
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<gloo::transport::Device>> devices;
  std::lock_guard lock(mutex);
  auto& d = devices[host];
  if (!d) {
    gloo::transport::tcp::attr attr;
    attr.hostname = host;
    d = gloo::transport::tcp::CreateDevice(attr);
  }
  return d;
}

std::string world_rank_list(const std::vector<int>& r) { return fmt::format("[{}]", fmt::join(r, ", ")); }

class GlooProcessGroup final : public ProcessGroup {
 public:
  GlooProcessGroup(std::shared_ptr<Store> store, std::string name, int rank, std::vector<int> world_ranks,
                   std::vector<int> nodes, std::string host, Millis timeout, GlooTransport transport)
      : ProcessGroup(name, rank, world_ranks, std::move(nodes), timeout),
        store_(std::move(store)),
        host_(std::move(host)),
        transport_(transport) {
    auto prefixed = std::make_shared<PrefixStore>(this->name(), store_);
    GlooStore gs(prefixed, timeout);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size());
    ctx->setTimeout(timeout);
    auto dev = device_for(host_);
    try {
      Activity activity(describe("creation") + ": waiting for every member to join");
      ctx->connectFullMesh(gs, dev);
    } catch (const TimeoutError& e) {
      throw TimeoutError(fmt::format("{}: ranks did not all join within {} ms: {}", describe("creation"), timeout.count(),
                                     e.what()));
    } catch (const std::exception& e) {
      throw CommError(fmt::format("{}: connecting the Gloo context failed: {}", describe("creation"), e.what()));
    }
    context_ = ctx;
    setup_hierarchy();
  }
  ~GlooProcessGroup() override { shutdown(); }
  // Makes the world's topology that of `node` on each rank (collective, right after creation).
  void adopt_node(int node) {
    int64_t mine = node;
    std::vector<int64_t> all(static_cast<size_t>(size()));
    shm_deferred_ = true;  // the shared-memory path is chosen once the nodes are known
    all_gather(&mine, all.data(), 1, DType::i64);
    shm_deferred_ = false;
    std::vector<int> nodes(all.begin(), all.end());
    if (std::any_of(nodes.begin(), nodes.end(), [&](int n) { return n != nodes[0]; })) set_nodes(std::move(nodes));
    reset_stats();  // the exchange is the world's set-up, not the program's communication
  }
  // "shm" once the group moves its collectives through shared memory, "tcp" once it decided
  // against it, "" before its first collective.
  std::string transport_in_use() const {
    if (!shm_decided_) return "";
    return shm_ ? "shm" : "tcp";
  }
  std::string backend() const override { return "gloo"; }
  const std::shared_ptr<gloo::Context>& context() const { return context_; }
  // Kept alive as long as the group: the heartbeat of this process's rank.
  void keep_heartbeat(std::unique_ptr<HeartbeatWriter> h) { heartbeat_ = std::move(h); }

 protected:
  void do_all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op) override {
    if (ShmCollectives* s = same_node())
      return run("all_reduce", [&](uint32_t) { s->all_reduce(buf, count, dtype, op); });
    tcp_all_reduce(buf, count, dtype, op);
  }

  void tcp_all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op) {
    run("all_reduce", [&](uint32_t tag) {
      gloo::AllreduceOptions o(context_);
      by_element_size(dtype, [&](auto t) { o.setOutput(static_cast<decltype(t)*>(buf), static_cast<size_t>(count)); });
      o.setReduceFunction(reduce_fn(dtype, op));
      o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      o.setTag(tag);
      o.setTimeout(timeout());
      gloo::allreduce(o);
    });
  }

  void do_broadcast(void* buf, int64_t count, DType dtype, int root) override {
    if (ShmCollectives* s = same_node())
      return run("broadcast", [&](uint32_t) { s->broadcast(buf, count, dtype, root); });
    run("broadcast", [&](uint32_t tag) {
      gloo::BroadcastOptions o(context_);
      by_element_size(dtype, [&](auto t) { o.setOutput(static_cast<decltype(t)*>(buf), static_cast<size_t>(count)); });
      o.setRoot(root);
      o.setTag(tag);
      o.setTimeout(timeout());
      gloo::broadcast(o);
    });
  }

  void do_reduce(void* buf, int64_t count, DType dtype, ReduceOp op, int root) override {
    if (ShmCollectives* s = same_node())
      return run("reduce", [&](uint32_t) { s->reduce(buf, count, dtype, op, root); });
    // Gloo's reduce uses non-root outputs as scratch: give non-roots a copy.
    std::vector<char> scratch;
    void* target = buf;
    if (rank() != root) {
      scratch.assign(static_cast<const char*>(buf), static_cast<const char*>(buf) + count * static_cast<int64_t>(dtype_size(dtype)));
      target = scratch.data();
    }
    run("reduce", [&](uint32_t tag) {
      gloo::ReduceOptions o(context_);
      by_element_size(dtype, [&](auto t) { o.setOutput(static_cast<decltype(t)*>(target), static_cast<size_t>(count)); });
      o.setReduceFunction(reduce_fn(dtype, op));
      o.setRoot(root);
      o.setTag(tag);
      o.setTimeout(timeout());
      gloo::reduce(o);
    });
  }

  void do_all_gather(const void* in, void* out, int64_t count, DType dtype) override {
    if (same_node()) return ProcessGroup::do_all_gather(in, out, count, dtype);  // the _v form, through memory
    run("all_gather", [&](uint32_t tag) {
      gloo::AllgatherOptions o(context_);
      by_element_size(dtype, [&](auto t) {
        using T = decltype(t);
        o.setInput(const_cast<T*>(static_cast<const T*>(in)), static_cast<size_t>(count));
        o.setOutput(static_cast<T*>(out), static_cast<size_t>(count * size()));
      });
      o.setTag(tag);
      o.setTimeout(timeout());
      gloo::allgather(o);
    });
  }

  void do_all_gather_v(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype) override {
    if (ShmCollectives* s = same_node()) return run("all_gather", [&](uint32_t) { s->all_gather_v(in, out, counts, dtype); });
    run("all_gather", [&](uint32_t tag) {
      gloo::AllgathervOptions o(context_);
      std::vector<size_t> c(counts.begin(), counts.end());
      by_element_size(dtype, [&](auto t) {
        using T = decltype(t);
        o.setInput(const_cast<T*>(static_cast<const T*>(in)), c[static_cast<size_t>(rank())]);
        o.setOutput(static_cast<T*>(out), c);
      });
      o.setTag(tag);
      o.setTimeout(timeout());
      gloo::allgatherv(o);
    });
  }

  // Segments to their owners (all_to_all), then a local reduction in rank order.
  void do_reduce_scatter_v(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype, ReduceOp op) override {
    if (ShmCollectives* s = same_node())
      return run("reduce_scatter", [&](uint32_t) { s->reduce_scatter_v(in, out, counts, dtype, op); });
    const int64_t mine = counts[static_cast<size_t>(rank())];
    const size_t esz = dtype_size(dtype);
    std::vector<int64_t> recv(static_cast<size_t>(size()), mine);
    std::vector<char> gathered(static_cast<size_t>(mine * size()) * esz);
    do_all_to_all_v(in, counts, gathered.data(), recv, dtype);
    if (mine == 0) return;
    if (dtype == DType::bf16) {  // accumulate in f32, round once
      std::vector<float> acc(static_cast<size_t>(mine)), tmp(static_cast<size_t>(mine));
      const auto* g = reinterpret_cast<const BFloat16*>(gathered.data());
      for (int64_t i = 0; i < mine; ++i) acc[static_cast<size_t>(i)] = static_cast<float>(g[i]);
      for (int r = 1; r < size(); ++r) {
        for (int64_t i = 0; i < mine; ++i) tmp[static_cast<size_t>(i)] = static_cast<float>(g[r * mine + i]);
        reduce_into(acc.data(), tmp.data(), mine, DType::f32, op);
      }
      auto* o = static_cast<BFloat16*>(out);
      for (int64_t i = 0; i < mine; ++i) o[i] = BFloat16(acc[static_cast<size_t>(i)]);
      return;
    }
    std::memcpy(out, gathered.data(), static_cast<size_t>(mine) * esz);
    for (int r = 1; r < size(); ++r) reduce_into(out, gathered.data() + static_cast<size_t>(r * mine) * esz, mine, dtype, op);
  }

  void do_all_to_all(const void* in, void* out, int64_t count, DType dtype) override {
    if (same_node()) return ProcessGroup::do_all_to_all(in, out, count, dtype);  // the _v form, through memory
    run("all_to_all", [&](uint32_t tag) {
      gloo::AlltoallOptions o(context_);
      by_element_size(dtype, [&](auto t) {
        using T = decltype(t);
        o.setInput(const_cast<T*>(static_cast<const T*>(in)), static_cast<size_t>(count * size()));
        o.setOutput(static_cast<T*>(out), static_cast<size_t>(count * size()));
      });
      o.setTag(tag);
      o.setTimeout(timeout());
      gloo::alltoall(o);
    });
  }

  void do_all_to_all_v(const void* in, const std::vector<int64_t>& send_counts, void* out,
                       const std::vector<int64_t>& recv_counts, DType dtype) override {
    if (ShmCollectives* s = same_node())
      return run("all_to_all", [&](uint32_t) { s->all_to_all_v(in, send_counts, out, recv_counts, dtype); });
    run("all_to_all", [&](uint32_t tag) {
      gloo::AlltoallvOptions o(context_);
      by_element_size(dtype, [&](auto t) {
        using T = decltype(t);
        o.setInput(const_cast<T*>(static_cast<const T*>(in)), send_counts);
        o.setOutput(static_cast<T*>(out), recv_counts);
      });
      o.setTag(tag);
      o.setTimeout(timeout());
      gloo::alltoallv(o);
    });
  }

  void do_gather(const void* in, void* out, int64_t count, DType dtype, int root) override {
    if (ShmCollectives* s = same_node())
      return run("gather", [&](uint32_t) { s->gather(in, out, count, dtype, root); });
    run("gather", [&](uint32_t tag) {
      gloo::GatherOptions o(context_);
      by_element_size(dtype, [&](auto t) {
        using T = decltype(t);
        o.setInput(const_cast<T*>(static_cast<const T*>(in)), static_cast<size_t>(count));
        if (rank() == root) o.setOutput(static_cast<T*>(out), static_cast<size_t>(count * size()));
      });
      o.setRoot(root);
      o.setTag(tag);
      o.setTimeout(timeout());
      gloo::gather(o);
    });
  }

  void do_scatter(const void* in, void* out, int64_t count, DType dtype, int root) override {
    if (ShmCollectives* s = same_node())
      return run("scatter", [&](uint32_t) { s->scatter(in, out, count, dtype, root); });
    run("scatter", [&](uint32_t tag) {
      gloo::ScatterOptions o(context_);
      by_element_size(dtype, [&](auto t) {
        using T = decltype(t);
        if (rank() == root) {
          std::vector<T*> parts;
          for (int r = 0; r < size(); ++r) parts.push_back(const_cast<T*>(static_cast<const T*>(in)) + r * count);
          o.setInputs(parts, static_cast<size_t>(count));
        }
        o.setOutput(static_cast<T*>(out), static_cast<size_t>(count));
      });
      o.setRoot(root);
      o.setTag(tag);
      o.setTimeout(timeout());
      gloo::scatter(o);
    });
  }

  void do_barrier() override {
    if (ShmCollectives* s = same_node()) return run("barrier", [&](uint32_t) { s->barrier(); });
    run("barrier", [&](uint32_t tag) {
      gloo::BarrierOptions o(context_);
      o.setTag(tag);
      o.setTimeout(timeout());
      gloo::barrier(o);
    });
  }

  WorkPtr do_send(const void* buf, size_t bytes, int dst, int tag) override {
    auto ub = std::shared_ptr<gloo::transport::UnboundBuffer>(context_->createUnboundBuffer(const_cast<void*>(buf), bytes));
    ub->send(dst, p2p_slot(tag));
    return std::make_shared<P2PWork>(ub, true, fmt::format("{} to rank {} (tag {})", describe("send"), dst, tag), timeout());
  }

  WorkPtr do_recv(void* buf, size_t bytes, int src, int tag) override {
    auto ub = std::shared_ptr<gloo::transport::UnboundBuffer>(context_->createUnboundBuffer(buf, bytes));
    ub->recv(src, p2p_slot(tag));
    return std::make_shared<P2PWork>(ub, false, fmt::format("{} from rank {} (tag {})", describe("recv"), src, tag),
                                     timeout());
  }

  std::shared_ptr<ProcessGroup> make_group(const std::vector<int>& members, const std::string& name) override {
    Members g = members_of(members);
    return std::make_shared<GlooProcessGroup>(store_, name, g.me, g.world_ranks, g.nodes, host_, timeout(), transport_);
  }

 private:
  // A send/recv on a Gloo unbound buffer; keeps the buffer alive until done.
  class P2PWork final : public Work {
   public:
    P2PWork(std::shared_ptr<gloo::transport::UnboundBuffer> buf, bool send, std::string what, Millis timeout)
        : buf_(std::move(buf)), send_(send), what_(std::move(what)), timeout_(timeout) {}
    void wait() override {
      std::lock_guard lock(mutex_);
      if (done_) return;
      try {
        Activity activity(what_);
        bool ok = send_ ? buf_->waitSend(timeout_) : buf_->waitRecv(timeout_);
        if (!ok) throw CommError(fmt::format("{}: aborted", what_));
      } catch (const gloo::IoException& e) {
        std::string msg = e.what();
        if (msg.find("Timed out") != std::string::npos || msg.find("timed out") != std::string::npos)
          throw TimeoutError(fmt::format("{} timed out after {} ms: {}", what_, timeout_.count(), msg));
        throw CommError(fmt::format("{} failed: {}", what_, msg));
      }
      done_ = true;
    }
    bool is_completed() override {
      std::lock_guard lock(mutex_);
      return done_;
    }

   private:
    std::mutex mutex_;
    std::shared_ptr<gloo::transport::UnboundBuffer> buf_;
    bool send_;
    bool done_ = false;
    std::string what_;
    Millis timeout_;
  };

  static uint64_t p2p_slot(int tag) { return gloo::Slot::build(0xF0, static_cast<uint32_t>(tag)); }

  // Runs one Gloo collective with a fresh tag; maps Gloo's errors to CommError naming the
  // group, the op and the ranks that did not report the same failure.
  void run(const char* op, const std::function<void(uint32_t)>& body) {
    uint32_t tag = static_cast<uint32_t>(++collectives_);
    try {
      Activity activity(fmt::format("{} (collective #{})", describe(op), tag));
      body(tag);
    } catch (const std::exception& e) {
      std::string msg = e.what();
      bool timed_out = msg.find("imed out") != std::string::npos;
      std::string missing = missing_ranks(tag);
      std::string text = fmt::format("{} (collective #{}) {}: {}{}", describe(op), tag,
                                     timed_out ? fmt::format("timed out after {} ms", timeout().count()) : "failed", msg,
                                     missing.empty() ? "" : "; " + missing);
      if (timed_out) throw TimeoutError(text);
      throw CommError(text);
    }
  }

  // Every rank whose collective #tag failed says so in the store; after a short grace the
  // ranks that did not are reported as missing (dead, or never reached the collective).
  std::string missing_ranks(uint32_t tag) {
    try {
      std::string base = fmt::format("{}/failed/{}/", name(), tag);
      store_->set(base + std::to_string(rank()), "1");
      auto deadline = Clock::now() + std::chrono::milliseconds(1500);
      std::vector<int> missing;
      for (;;) {
        missing.clear();
        for (int r = 0; r < size(); ++r)
          if (!store_->check({base + std::to_string(r)})) missing.push_back(ranks()[static_cast<size_t>(r)]);
        if (missing.empty() || Clock::now() > deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (missing.empty()) return "";
      // What the missing ranks' heartbeats (under `tessel launch`) last said.
      std::string beats;
      for (int r : missing) {
        const std::string key = heartbeat_key(r);
        if (!store_->check({key})) continue;
        if (auto h = parse_heartbeat(store_->get(key, Millis(1000))))
          beats += fmt::format("; rank {}'s last heartbeat (#{}): {}", r, h->count, h->describe());
      }
      return fmt::format("missing world ranks {} (dead or never reached this collective){}", world_rank_list(missing),
                         beats);
    } catch (const std::exception&) {
      return "the store is unreachable too (rank 0 or the launcher may be gone)";
    }
  }

  // The shared-memory path when every member is on this node and the transport allows it; set up
  // (collectively) by the first collective that can use it. Null: Gloo's TCP transport.
  ShmCollectives* same_node() {
    if (shm_deferred_) return nullptr;
    if (!shm_decided_) {
      shm_decided_ = true;
      const bool one_node = std::all_of(nodes().begin(), nodes().end(), [&](int n) { return n == nodes().front(); });
      if (transport_ == GlooTransport::automatic && size() > 1 && one_node) {
        auto all_ok = [&](bool mine) {
          int32_t ok = mine ? 1 : 0;
          tcp_all_reduce(&ok, 1, DType::i32, ReduceOp::min);
          return ok == 1;
        };
        std::string why_not;
        shm_ = ShmCollectives::connect(*store_, fmt::format("{}/shm", name()), rank(), size(), timeout(), all_ok, 0,
                                       &why_not);
        if (!shm_ && rank() == 0)
          fmt::print(stderr, "warning: {}: ranks of one node talk over TCP: no shared memory ({})\n", describe("set-up"),
                     why_not);
      }
    }
    if (shm_) shm_->set_timeout(timeout());
    return shm_.get();
  }

  std::shared_ptr<Store> store_;
  std::string host_;
  GlooTransport transport_;
  bool shm_deferred_ = false, shm_decided_ = false;
  std::unique_ptr<ShmCollectives> shm_;
  std::shared_ptr<gloo::Context> context_;
  uint64_t collectives_ = 0;
  std::unique_ptr<HeartbeatWriter> heartbeat_;
};

int env_int(const char* name, int fallback, bool required) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    TESSEL_CHECK(!required, "environment variable {} is not set (start the program with `tessel launch`)", name);
    return fallback;
  }
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  TESSEL_CHECK(end != v && *end == '\0' && x >= 0, "environment variable {}='{}' is not a non-negative integer", name, v);
  return static_cast<int>(x);
}

}  // namespace

GlooWorldOptions GlooWorldOptions::from_env(Millis timeout) {
  GlooWorldOptions o;
  o.rank = env_int("RANK", 0, true);
  o.size = env_int("WORLD_SIZE", 1, true);
  TESSEL_CHECK(o.rank < o.size, "RANK={} is not below WORLD_SIZE={}", o.rank, o.size);
  const char* addr = std::getenv("MASTER_ADDR");
  o.master_addr = addr && *addr ? addr : "127.0.0.1";
  o.master_port = env_int("MASTER_PORT", 0, true);
  const char* token = std::getenv("TESSEL_JOB_TOKEN");
  o.token = token ? token : "";
  o.local_world_size = env_int("LOCAL_WORLD_SIZE", 0, false);
  o.node = env_int("TESSEL_NODE", env_int("GROUP_RANK", -1, false), false);
  const char* host = std::getenv("TESSEL_GLOO_HOST");
  o.bind_host = host ? host : "";
  o.timeout = timeout;
  o.heartbeat_interval = Millis(env_int("TESSEL_HEARTBEAT_MS", 0, false));
  const char* prefix = std::getenv("TESSEL_STORE_PREFIX");
  o.store_prefix = prefix ? prefix : "";
  return o;
}

GlooTransport gloo_transport_from_env() {
  const char* v = std::getenv("TESSEL_GLOO_TRANSPORT");
  const std::string t = v != nullptr ? v : "";
  if (t.empty() || t == "auto") return GlooTransport::automatic;
  TESSEL_CHECK(t == "tcp", "environment variable TESSEL_GLOO_TRANSPORT='{}' must be auto or tcp", t);
  return GlooTransport::tcp;
}

std::shared_ptr<ProcessGroup> make_gloo_group(std::shared_ptr<Store> store, int rank, int size, std::vector<int> nodes,
                                              const std::string& bind_host, Millis timeout, const std::string& name,
                                              std::optional<GlooTransport> transport) {
  std::vector<int> ranks(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) ranks[static_cast<size_t>(r)] = r;
  return std::make_shared<GlooProcessGroup>(std::move(store), name, rank, ranks, std::move(nodes),
                                            bind_host.empty() ? "127.0.0.1" : bind_host, timeout,
                                            transport.value_or(gloo_transport_from_env()));
}

std::string gloo_transport_in_use(const ProcessGroup& group) {
  const auto* g = dynamic_cast<const GlooProcessGroup*>(&group);
  return g != nullptr ? g->transport_in_use() : "";
}

void gloo_direct_ring_all_reduce(ProcessGroup& group, float* buf, int64_t count, bool classic) {
  auto* g = dynamic_cast<GlooProcessGroup*>(&group);
  TESSEL_CHECK(g != nullptr, "gloo_direct_ring_all_reduce: group '{}' uses the {} backend, not gloo", group.name(),
               group.backend());
  if (classic) {
    gloo::AllreduceRing<float> ring(g->context(), {buf}, static_cast<int>(count));
    ring.run();
    return;
  }
  gloo::AllreduceOptions o(g->context());
  o.setOutput(buf, static_cast<size_t>(count));
  o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
  o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
  o.setTag(0x7fffffff);
  gloo::allreduce(o);
}

std::shared_ptr<Store> connect_job_store(const GlooWorldOptions& o, bool round_namespace) {
  auto tcp = std::make_shared<TcpStore>(o.master_addr, o.master_port, o.token, o.timeout);
  tcp->set_timeout(o.timeout);
  if (!round_namespace || o.store_prefix.empty()) return tcp;
  return std::make_shared<PrefixStore>(o.store_prefix, std::move(tcp));
}

std::shared_ptr<ProcessGroup> make_gloo_world(const GlooWorldOptions& o) {
  std::shared_ptr<Store> store = connect_job_store(o);
  int node = o.node;
  if (node < 0) node = o.local_world_size > 0 ? o.rank / o.local_world_size : 0;
  std::string host = o.bind_host;
  if (host.empty()) {
    bool loopback = o.master_addr.rfind("127.", 0) == 0 || o.master_addr == "localhost" || o.master_addr == "::1";
    if (loopback) {
      host = "127.0.0.1";
    } else {
      char name[256] = {};
      ::gethostname(name, sizeof name - 1);
      host = name;
    }
  }
  // The heartbeat starts before the rendezvous, which may wait long for the other ranks, and on
  // a connection of its own, so that waits on the rank's store never delay a beat.
  std::unique_ptr<HeartbeatWriter> heartbeat;
  if (o.heartbeat_interval.count() > 0)
    heartbeat = std::make_unique<HeartbeatWriter>(connect_job_store(o), o.rank, o.heartbeat_interval);
  // One node until every rank's id is known: the world gathers them through itself (one small
  // all_gather, not a store read per rank), then builds its hierarchy.
  auto group = std::static_pointer_cast<GlooProcessGroup>(make_gloo_group(store, o.rank, o.size, {}, host, o.timeout, "world"));
  if (heartbeat) group->keep_heartbeat(std::move(heartbeat));
  if (o.size > 1) group->adopt_node(node);
  return group;
}

}  // namespace tessel
