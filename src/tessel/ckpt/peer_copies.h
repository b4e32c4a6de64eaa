// In-memory checkpoints on machines that do not share a folder (each has its own tmpfs): every
// machine's folder holds the pieces its own ranks wrote and a *peer copy* of the pieces of the
// machine before it in ring order (sent over the job's process group at the save), so that when
// one machine is lost the others still hold every piece in memory and a restart need not touch
// the disk. The step folder keeps the format of sharded.h; its manifest.json adds
// "memory_copies": {"own": [ranks], "peer": [ranks]}, the saving ranks whose pieces it holds,
// and a folder that lacks some is not complete on its own (checkpoint_incomplete says why).
// Before a resume the machines left copy whatever pieces each lacks from one that has them, so
// every machine's folder is whole and is read as any step folder. See docs/checkpoint.md.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tessel/comm/process_group.h"
#include "tessel/core/json.h"

namespace tessel {

// The machine of every rank of `group` (null: alone), in rank order, named by the lowest rank
// that sees the same `dir` — one tmpfs, or one folder of a shared file system. Collective;
// creates `dir` when missing.
std::vector<int> folder_machines(const std::string& dir, ProcessGroup* group);

// How many machines `machines` (folder_machines) names.
int machine_count(const std::vector<int>& machines);

// The rank that holds a peer copy of `rank`'s pieces: on the next machine in ring order (of the
// machines' names), the rank with the same local index modulo that machine's size; -1 when there
// is one machine.
int peer_copy_rank(const std::vector<int>& machines, int rank);

// "" when the step folder `step_dir`, whose manifest is `manifest`, holds every piece its
// checkpoint.json lists (always so without "memory_copies"), else which saving ranks' pieces it
// lacks.
std::string memory_copy_missing(const Json& manifest, const std::string& step_dir);

// The in-memory checkpoint to resume from, collectively over `group` (null: alone), whose ranks
// sit on `machines` (folder_machines of `dir`): the newest step whose pieces the machines'
// folders hold between them — their own and their peer copies. A machine that lacks some
// (or the whole step) gets them first, over `group`, from a machine that has them, so that
// every rank then finds the whole step in its own `dir`. Returns {(step, its folder under
// `dir`)}, or nothing when no step is held whole (a machine and the one holding its peer copies
// were both lost): the run then resumes from --save. Steps before `at_least` (the newest on
// disk) are passed over. `log`: this rank logs every decision.
std::vector<std::pair<int64_t, std::string>> memory_steps_held(const std::string& dir, ProcessGroup* group,
                                                               const std::vector<int>& machines, bool log,
                                                               int64_t at_least = -1);

}  // namespace tessel
