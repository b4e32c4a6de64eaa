// The in-memory checkpoints of a run under `tessel launch` (train.memory_save_every): the
// folder, and — when the ranks sit on several machines, each with its own tmpfs — which machine
// every rank is on, so that each save also leaves a peer copy of every machine's pieces in
// another machine's memory (ckpt/peer_copies.h). See docs/checkpoint.md.
#pragma once

#include <string>
#include <vector>

#include "tessel/comm/process_group.h"

namespace tessel {

struct MemoryCheckpoints {
  std::string dir;            // "": no in-memory checkpoints
  std::vector<int> machines;  // the machine of every rank (folder_machines); all alike on one machine
  // The save options' machines: empty when every rank writes into one folder.
  std::vector<int> save_machines() const;
};

// Collective over `world`: `dir` with the machines of the ranks (`every` <= 0 or an empty `dir`:
// none). `log`: this rank says what it chose.
MemoryCheckpoints setup_memory_checkpoints(const std::string& dir, int64_t every, ProcessGroup* world, bool log);

}  // namespace tessel
