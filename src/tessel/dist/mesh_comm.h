// The process groups behind a mesh: this rank's group along each mesh dim, made from the
// world group the first time a collective along that dim is needed (only the members of a
// group take part in making it) and cached per rank.
#pragma once

#include <memory>

#include "tessel/comm/process_group.h"
#include "tessel/sharding/mesh.h"

namespace tessel {

// This rank's group along `dim` of `mesh`; the rank must be in the mesh.
std::shared_ptr<ProcessGroup> mesh_dim_group(const ProcessMesh& mesh, int64_t dim);
// What this rank issued on its world group and on every mesh dim group it has made so far,
// summed per operation kind (the counters of the comm layer, never reset here).
CommStats mesh_comm_stats();
// This rank's world rank (its world group's rank, or the rank context's when there is none).
int64_t current_world_rank();

}  // namespace tessel
