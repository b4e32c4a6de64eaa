// The trace backend: one rank of a world whose other ranks are not there. Every collective and
// send/recv is checked and counted by ProcessGroup like any backend's (stats_by_group) and
// completes at once without moving data. A step run on it in meta mode (core/context.h) issues
// exactly what that rank would issue in a real run of the layout — the planner's collectives
// come from here.
#pragma once

#include <memory>
#include <vector>

#include "tessel/comm/process_group.h"

namespace tessel {

// The world group of rank `rank` of `world_size` (nodes: each rank's node; empty: one node).
std::shared_ptr<ProcessGroup> make_trace_world(int world_size, int rank, std::vector<int> nodes = {});

}  // namespace tessel
