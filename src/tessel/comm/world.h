// The calling rank's world group. Thread ranks get theirs from spawn(); processes started by
// `tessel launch` create theirs with init_world() (Gloo, from the launcher's environment). A
// process that was not launched and calls init_world() gets a single-rank world.
#pragma once

#include <memory>
#include <string>

#include "tessel/comm/process_group.h"

namespace tessel {

// The world group of this rank; throws when none was set up.
std::shared_ptr<ProcessGroup> world_group();
bool has_world_group();
// Installs `group` as this rank's world (spawn and init_world do this) and makes the rank context's
// rank and world_size those of the group.
void set_world_group(std::shared_ptr<ProcessGroup> group);

struct WorldOptions {
  std::string backend = "auto";  // auto (gloo under tessel launch, else a single thread rank), gloo, thread
  Millis timeout = default_timeout();
};

// Creates and installs the world group from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// LOCAL_WORLD_SIZE and TESSEL_JOB_TOKEN, or a single-rank world when they are absent.
std::shared_ptr<ProcessGroup> init_world(const WorldOptions& options = {});

}  // namespace tessel
