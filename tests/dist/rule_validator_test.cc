// The SPMD rule validator: for every op with a rule and every combination of input placements
// on 1-D meshes of 2, 3 and 4 ranks and on a 2x2 mesh (a sample on 2x2x2), on the op test
// table's shapes — many of which split unevenly, some into empty pieces — the sharded forward
// output and every input gradient must equal the single-rank result (f64). Every failure is
// printed with its op, case and placements; the test fails if there is one.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "tessel/ops/registry.h"
#include "validator.h"

namespace tessel::testing {
namespace {

struct MeshCase {
  Shape shape;
  size_t limit;  // combinations tried (all when fewer)
};

TEST(RuleValidator, ShardedEqualsSerialForEveryOpAndPlacement) {
  const std::vector<MeshCase> meshes = {{{2}, 100000}, {{3}, 100000}, {{4}, 100000}, {{2, 2}, 4096}, {{2, 2, 2}, 48}};
  std::vector<std::string> failures;
  std::map<std::string, int> cases_per_op, combos_per_op;
  int total = 0;
  // TESSEL_VALIDATE_OP=name and TESSEL_VALIDATE_MESH=2x2 narrow the run while debugging a rule.
  const char* only_op = std::getenv("TESSEL_VALIDATE_OP");
  const char* only_mesh = std::getenv("TESSEL_VALIDATE_MESH");
  for (const OpCase& c : all_cases()) {
    const OpDef* op = find_op(c.op);
    if (op == nullptr || op->spmd == nullptr) continue;
    if (only_op != nullptr && c.op != only_op) continue;
    if (cases_per_op[c.op] >= 2) continue;  // the first two cases of each op (incl. edge shapes)
    ++cases_per_op[c.op];
    Serial s = serial_run(c);
    for (const MeshCase& mc : meshes) {
      if (only_mesh != nullptr && parse_shape(only_mesh) != mc.shape) continue;
      ProcessMesh mesh = ProcessMesh::iota(mc.shape);
      auto combos = combinations(s.inputs, mesh.ndim(), mc.limit, 17);
      combos_per_op[c.op] += static_cast<int>(combos.size());
      total += static_cast<int>(combos.size());
      for (std::string& f : validate(c, s, mesh, combos)) failures.push_back(std::move(f));
    }
  }
  std::vector<std::string> without;
  for (const OpDef* op : all_ops())
    if (op->spmd == nullptr) without.push_back(std::string(op->name));
  std::printf("rule validator: %d placement combinations over %zu ops; %zu failures\n", total, cases_per_op.size(),
              failures.size());
  for (const auto& [op, n] : combos_per_op) std::printf("  %-14s %6d combinations\n", op.c_str(), n);
  if (!without.empty()) std::printf("ops without an SPMD rule: %s\n", fmt::format("{}", fmt::join(without, ", ")).c_str());
  for (size_t i = 0; i < failures.size() && i < 60; ++i) std::printf("FAIL %s\n", failures[i].c_str());
  EXPECT_TRUE(failures.empty()) << failures.size() << " failing combinations (first printed above)";
  EXPECT_TRUE(without.empty()) << "ops without an SPMD rule: " << fmt::format("{}", fmt::join(without, ", "));
}

}  // namespace
}  // namespace tessel::testing
