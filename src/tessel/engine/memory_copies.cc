// The in-memory checkpoints of a run (memory_copies.h).
#include "tessel/engine/memory_copies.h"

#include "tessel/ckpt/peer_copies.h"
#include "tessel/core/log.h"

namespace tessel {

std::vector<int> MemoryCheckpoints::save_machines() const {
  return machine_count(machines) > 1 ? machines : std::vector<int>{};
}

MemoryCheckpoints setup_memory_checkpoints(const std::string& dir, int64_t every, ProcessGroup* world, bool log) {
  MemoryCheckpoints m;
  if (every <= 0 || dir.empty()) return m;
  m.dir = dir;
  m.machines = folder_machines(dir, world);
  const int count = machine_count(m.machines);
  if (log && count == 1)
    log_info("in-memory checkpoints every {} step{} in {}", every, every == 1 ? "" : "s", dir);
  else if (log)
    log_info("in-memory checkpoints every {} step{} in {} on each of {} machines (the ranks do not share it): each "
             "machine keeps its own ranks' pieces and a peer copy of the previous machine's, so losing one machine "
             "loses nothing in memory", every, every == 1 ? "" : "s", dir, count);
  return m;
}

}  // namespace tessel
