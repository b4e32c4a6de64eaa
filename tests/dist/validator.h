// The SPMD rule validator's machinery, shared by the thread-rank test and the program run on
// Gloo ranks under `tessel launch`: the single-rank oracle of an op case, the placement
// combinations to try, and the per-rank check of a case on a mesh.
#pragma once

#include <string>
#include <vector>

#include "ops/op_cases.h"
#include "tessel/sharding/dist_attr.h"
#include "tessel/sharding/spmd.h"

namespace tessel::testing {

struct Serial {
  Tensors inputs, outputs, weights, grads;  // grads[i] undefined for non-floating inputs
};

// The case run on one rank: outputs, the fixed weights of its loss, and the input gradients.
Serial serial_run(const OpCase& c);
// Every placement list (R, S(d) for each dim, and P(sum) when `floating`) for a tensor of rank
// `rank` on a mesh of `ndim` dims.
std::vector<Placements> placement_lists(int64_t rank, bool floating, int64_t ndim);
// Every placement combination for the inputs on a mesh of `ndim` dims, or `limit` of them
// drawn deterministically from `seed` when there are more.
std::vector<std::vector<Placements>> combinations(const Tensors& inputs, int64_t ndim, size_t limit, uint64_t seed);
std::string combo_str(const std::vector<Placements>& combo);
// What the rules recorded in `audit` chose, checked against every candidate they considered,
// each priced again by the reshard planner: "" when no candidate is cheaper than the chosen
// one and every rule's price agrees with the planner's.
std::string check_choices(const SpmdAudit& audit, const ProcessMesh& mesh);
// Runs the combos on this rank (every rank of the mesh calls it with the same arguments) and
// returns what differed from the oracle.
std::vector<std::string> validate_on_rank(const OpCase& c, const Serial& s, const ProcessMesh& mesh,
                                          const std::vector<std::vector<Placements>>& combos, int rank);
// The same on thread ranks spawned for the mesh; rank 0's failures.
std::vector<std::string> validate(const OpCase& c, const Serial& s, const ProcessMesh& mesh,
                                  const std::vector<std::vector<Placements>>& combos);

}  // namespace tessel::testing
