// `tessel explain-reshard SRC DST --mesh 2x2 --shape 8,6 [--dtype f32]`: prints the plan that
// turns one layout into another, step by step, with the bytes each rank hands over.
#include <algorithm>
#include <cstdio>

#include "tessel/cli/commands.h"
#include "tessel/core/error.h"
#include "tessel/dist/reshard.h"

namespace tessel {

namespace {

constexpr int64_t kMaxExplainRanks = int64_t{1} << 17;

// A whole DistAttr "mesh(dp=2,tp=2)[S(0),R]" rather than placements alone.
bool names_its_mesh(const std::string& text) { return text.starts_with("mesh("); }

// "[S(0),R]" on --mesh, or a whole DistAttr "mesh(dp=2,tp=2)[S(0),R]" (which may name another mesh).
DistAttr layout(const std::string& text, const std::string& mesh_text, const char* which) {
  try {
    if (names_its_mesh(text)) return DistAttr::parse(text);
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
             if (names_its_mesh(a->src) && names_its_mesh(a->dst) && !a->mesh.empty())
               throw BadInput(fmt::format("--mesh {} would not be used: SRC and DST each name their mesh", a->mesh));
             DistAttr src = layout(a->src, a->mesh, "SRC"), dst = layout(a->dst, a->mesh, "DST");
             for (const DistAttr* d : {&src, &dst})
               if (d->mesh.size() > kMaxExplainRanks)
                 throw BadInput(fmt::format("the {} mesh has {} ranks; explain-reshard lists every rank's part and "
                                            "takes minutes above {}",
                                            d == &src ? "SRC" : "DST", d->mesh.size(), kMaxExplainRanks));
             Shape shape;
             DType dtype;
             try {
               const std::string& s = a->shape;
               TESSEL_CHECK(s.find(",,") == std::string::npos && !s.starts_with(',') && !s.ends_with(','),
                            "--shape '{}' has an empty dim between commas", s);
               shape = parse_shape(s);
               dtype = parse_dtype(a->dtype);
               int64_t bytes = static_cast<int64_t>(dtype_size(dtype));
               for (int64_t d : shape)
                 TESSEL_CHECK(!__builtin_mul_overflow(bytes, std::max<int64_t>(d, 1), &bytes) && bytes <= (int64_t{1} << 62),
                              "--shape {} of {} is too large (more than 2^62 bytes)", shape_str(shape), dtype_name(dtype));
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
