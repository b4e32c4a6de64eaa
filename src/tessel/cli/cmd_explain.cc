// `tessel explain-reshard SRC DST --mesh 2x2 --shape 8,6 [--dtype f32]`: prints the plan that
// turns one layout into another, step by step, with the bytes each rank hands over.
#include <cstdio>

#include "tessel/cli/commands.h"
#include "tessel/core/error.h"
#include "tessel/dist/reshard.h"

namespace tessel {

namespace {

// "[S(0),R]" on --mesh, or a whole DistAttr "mesh(dp=2,tp=2)[S(0),R]" (which may name another mesh).
DistAttr layout(const std::string& text, const std::string& mesh_text, const char* which) {
  try {
    if (text.rfind("mesh(", 0) == 0) return DistAttr::parse(text);
    TESSEL_CHECK(!mesh_text.empty(), "{} '{}' gives only placements: pass --mesh (e.g. --mesh 2x2)", which, text);
    return DistAttr(ProcessMesh::parse(mesh_text), parse_placements(text));
  } catch (const Error& e) {
    throw BadInput(e.what());
  }
}

}  // namespace

std::vector<Command> register_explain(CLI::App& app) {
  struct Args {
    std::string src, dst, mesh, shape, dtype = "f32";
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "explain-reshard",
      "print the plan that turns one layout into another: its collectives, mesh dims and bytes per rank");
  cmd->add_option("src", a->src, "source placements, e.g. '[S(0),R]', or a full 'mesh(dp=2,tp=2)[S(0),R]'")->required();
  cmd->add_option("dst", a->dst, "destination placements or a full DistAttr (may be on another mesh)")->required();
  cmd->add_option("--mesh", a->mesh, "the mesh for placements given alone: 2x2, or mesh(dp=2,tp=2)[[0,1],[2,3]]");
  cmd->add_option("--shape", a->shape, "global tensor shape, e.g. 8,6")->required();
  cmd->add_option("--dtype", a->dtype, "element type (f32, f64, bf16, i32, i64, bool)");
  return {{cmd, [a] {
             DistAttr src = layout(a->src, a->mesh, "SRC"), dst = layout(a->dst, a->mesh, "DST");
             Shape shape;
             DType dtype;
             try {
               shape = parse_shape(a->shape);
               dtype = parse_dtype(a->dtype);
               src.check(shape, "SRC");
               dst.check(shape, "DST");
             } catch (const Error& e) {
               throw BadInput(e.what());
             }
             ReshardPlan plan = plan_reshard(src, dst, shape, dtype);
             std::printf("%s", plan.str().c_str());
             return 0;
           }}};
}

}  // namespace tessel
