// The per-rank world group and its creation from the launcher's environment.
#include "tessel/comm/world.h"

#include <cstdlib>

#include "tessel/comm/gloo_backend.h"
#include "tessel/comm/thread_backend.h"
#include "tessel/core/context.h"
#include "tessel/core/error.h"

namespace tessel {

namespace {
struct WorldHolder {
  std::shared_ptr<ProcessGroup> group;
};
}  // namespace

std::shared_ptr<ProcessGroup> world_group() {
  auto h = rank_context().get_ext<WorldHolder>();
  TESSEL_CHECK(h && h->group, "no world group on this rank: run inside tessel::spawn, or call init_world() in a "
                              "process started by `tessel launch`");
  return h->group;
}

bool has_world_group() {
  auto h = rank_context().get_ext<WorldHolder>();
  return h && h->group;
}

void set_world_group(std::shared_ptr<ProcessGroup> group) {
  auto h = std::make_shared<WorldHolder>();
  h->group = std::move(group);
  RankContext& ctx = rank_context();
  if (h->group) {  // the context's rank is the world rank (read on every distributed op)
    ctx.rank = static_cast<int>(h->group->rank());
    ctx.world_size = static_cast<int>(h->group->size());
  }
  ctx.set_ext(h);
}

std::shared_ptr<ProcessGroup> init_world(const WorldOptions& options) {
  bool launched = std::getenv("RANK") != nullptr && std::getenv("WORLD_SIZE") != nullptr;
  std::string backend = options.backend;
  if (backend == "auto") backend = launched ? "gloo" : "thread";
  std::shared_ptr<ProcessGroup> g;
  if (backend == "gloo") {
    TESSEL_CHECK(launched, "init_world: the gloo backend needs RANK and WORLD_SIZE (start the program with `tessel launch`)");
    g = make_gloo_world(GlooWorldOptions::from_env(options.timeout));
  } else if (backend == "thread") {
    TESSEL_CHECK(!launched || std::atoi(std::getenv("WORLD_SIZE")) == 1,
                 "init_world: this process is rank {} of {} started by a launcher; the thread backend runs its ranks "
                 "with tessel::spawn inside one process — use backend gloo",
                 std::getenv("RANK"), std::getenv("WORLD_SIZE"));
    g = make_thread_group(make_thread_world(1, options.timeout), 0);
  } else {
    TESSEL_THROW("init_world: unknown backend '{}' (expected auto, gloo or thread)", backend);
  }
  set_world_group(g);
  return g;
}

}  // namespace tessel
