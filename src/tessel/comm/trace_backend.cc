// The trace backend: groups that count and complete without a peer.
#include "tessel/comm/trace_backend.h"

#include "tessel/core/error.h"

namespace tessel {

namespace {

class TraceProcessGroup final : public ProcessGroup {
 public:
  TraceProcessGroup(std::string name, int rank, std::vector<int> world_ranks, std::vector<int> nodes)
      : ProcessGroup(std::move(name), rank, std::move(world_ranks), std::move(nodes), default_timeout()) {}
  ~TraceProcessGroup() override { shutdown(); }
  std::string backend() const override { return "trace"; }

  void init() { setup_hierarchy(); }

 protected:
  void do_all_reduce(void*, int64_t, DType, ReduceOp) override {}
  void do_broadcast(void*, int64_t, DType, int) override {}
  void do_reduce(void*, int64_t, DType, ReduceOp, int) override {}
  void do_all_gather_v(const void*, void*, const std::vector<int64_t>&, DType) override {}
  void do_reduce_scatter_v(const void*, void*, const std::vector<int64_t>&, DType, ReduceOp) override {}
  void do_all_to_all_v(const void*, const std::vector<int64_t>&, void*, const std::vector<int64_t>&, DType) override {}
  void do_gather(const void*, void*, int64_t, DType, int) override {}
  void do_scatter(const void*, void*, int64_t, DType, int) override {}
  void do_barrier() override {}
  void do_all_gather(const void*, void*, int64_t, DType) override {}
  void do_reduce_scatter(const void*, void*, int64_t, DType, ReduceOp) override {}
  void do_all_to_all(const void*, void*, int64_t, DType) override {}
  void do_all_gather_rows(const void*, void*, int64_t, const std::vector<int64_t>&, DType) override {}
  void do_reduce_scatter_rows(const void*, void*, int64_t, const std::vector<int64_t>&, DType, ReduceOp) override {}
  WorkPtr do_send(const void*, size_t, int, int) override { return done(); }
  WorkPtr do_recv(void*, size_t, int, int) override { return done(); }

  std::shared_ptr<ProcessGroup> make_group(const std::vector<int>& members, const std::string& name) override {
    Members g = members_of(members);
    return make(name, g.me, std::move(g.world_ranks), std::move(g.nodes));
  }

 public:
  static std::shared_ptr<ProcessGroup> make(const std::string& name, int rank, std::vector<int> world_ranks,
                                            std::vector<int> nodes) {
    auto g = std::make_shared<TraceProcessGroup>(name, rank, std::move(world_ranks), std::move(nodes));
    g->init();  // the hierarchy's groups, when the nodes call for them
    return g;
  }

 private:
  static WorkPtr done() {
    auto w = std::make_shared<CompletionWork>();
    w->finish();
    return w;
  }
};

}  // namespace

std::shared_ptr<ProcessGroup> make_trace_world(int world_size, int rank, std::vector<int> nodes) {
  TESSEL_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "trace world: rank {} of {}", rank, world_size);
  TESSEL_CHECK(nodes.empty() || static_cast<int>(nodes.size()) == world_size, "trace world: {} node ids for {} ranks",
               nodes.size(), world_size);
  std::vector<int> ranks(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) ranks[static_cast<size_t>(r)] = r;
  return TraceProcessGroup::make("world", rank, std::move(ranks), std::move(nodes));
}

}  // namespace tessel
