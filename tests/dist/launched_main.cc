// The distributed-tensor checks on Gloo ranks (real processes), for `tessel launch`:
//   dist_launched   on 4 processes: a sampled subset of the rule validator (2x2 and 4-rank
//                   meshes) and of the reshard pairs on a 2x2 mesh, each against the
//                   single-rank oracle computed in every process.
// Exit status 0 when every check passed on this rank.
#include <cstdio>
#include <set>

#include "tessel/comm/world.h"
#include "tessel/core/context.h"
#include "tessel/core/philox.h"
#include "tessel/dist/dtensor.h"
#include "tessel/dist/reshard.h"
#include "tessel/ops/registry.h"
#include "validator.h"

using namespace tessel;
using namespace tessel::testing;

int main() {
  try {
    auto world = init_world({.backend = "gloo", .timeout = Millis(60'000)});
    TESSEL_CHECK(world->size() == 4, "dist_launched expects 4 processes, got {}", world->size());
    const int rank = world->rank();
    std::vector<std::string> failures;
    int checks = 0;
    // Rule validator: the first case of each op, 24 sampled combinations per mesh.
    std::set<std::string> seen;
    for (const OpCase& c : all_cases()) {
      const OpDef* op = find_op(c.op);
      if (op == nullptr || op->spmd == nullptr || !seen.insert(c.op).second) continue;
      Serial s = serial_run(c);
      for (const Shape& shape : {Shape{2, 2}, Shape{4}}) {
        ProcessMesh mesh = ProcessMesh::iota(shape);
        auto combos = combinations(s.inputs, mesh.ndim(), 24, 99);
        checks += static_cast<int>(combos.size());
        for (std::string& f : validate_on_rank(c, s, mesh, combos, rank)) failures.push_back(std::move(f));
      }
    }
    // Reshard pairs on 2x2 for an uneven shape.
    ProcessMesh mesh = ProcessMesh::iota({2, 2});
    Tensor full = Tensor::empty({5, 3}, DType::f64);
    rng_fill(full, Distribution::uniform, -1, 1, 3, 4);
    std::vector<Placement> one{Replicate(), Partial(), Shard(0), Shard(1)};
    for (const Placement& a0 : one)
      for (const Placement& a1 : one)
        for (const Placement& b0 : one)
          for (const Placement& b1 : one) {
            ++checks;
            NoGradGuard g;
            Tensor r = reshard(shard_tensor(full, mesh, {a0, a1}), mesh, {b0, b1});
            std::vector<double> got = full_tensor(r).to_doubles(), want = full.to_doubles();
            for (size_t i = 0; i < got.size(); ++i)
              if (std::abs(got[i] - want[i]) > 1e-12) {
                failures.push_back(fmt::format("rank {}: reshard [{},{}] -> [{},{}] value {}", rank, a0.str(), a1.str(),
                                               b0.str(), b1.str(), i));
                break;
              }
          }
    std::printf("rank %d: %d checks on gloo, %zu failures\n", rank, checks, failures.size());
    for (size_t i = 0; i < failures.size() && i < 20; ++i) std::printf("FAIL %s\n", failures[i].c_str());
    return failures.empty() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
