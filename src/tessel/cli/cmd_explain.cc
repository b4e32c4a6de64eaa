// `tessel explain-reshard SRC DST --mesh 2x2 --shape 8,6 [--dtype f32]`: prints the plan that
// turns one layout into another, step by step, with the bytes each rank hands over.
// `tessel explain-rule OP --mesh 2x2 --input 4,6,8:[S(2),S(0)] [--attr dim=-1] [--top 5]`:
// prints the layout an op's SPMD rule chooses for inputs in those layouts, its cost, and the
// next-best candidates the rule weighed with theirs — where a layout costs more than needed.
#include <algorithm>
#include <cstdio>

#include "tessel/cli/commands.h"
#include "tessel/core/error.h"
#include "tessel/dist/reshard.h"
#include "tessel/ops/dispatch.h"
#include "tessel/ops/registry.h"
#include "tessel/sharding/spmd.h"
#include "tessel/sharding/spmd_rules.h"

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

// "k=v": true/false, an int, a list "1,2" or "[1]" (brackets make a one-element list; "[]" the
// empty one), a float, else a string.
std::pair<std::string, AttrValue> parse_attr(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) throw BadInput(fmt::format("--attr '{}' is not key=value", text));
  const std::string k = text.substr(0, eq), v = text.substr(eq + 1);
  if (v == "true" || v == "false") return {k, v == "true"};
  if (v == "[]") return {k, std::vector<int64_t>{}};
  try {
    const bool bracketed = v.size() > 2 && v.front() == '[' && v.back() == ']';
    if (bracketed || v.find(',') != std::string::npos) {
      std::vector<int64_t> xs;
      for (int64_t x : parse_shape(bracketed ? v.substr(1, v.size() - 2) : v)) xs.push_back(x);
      return {k, xs};
    }
    size_t used = 0;
    const long long i = std::stoll(v, &used);
    if (used == v.size()) return {k, static_cast<int64_t>(i)};
    const double d = std::stod(v, &used);
    if (used == v.size()) return {k, d};
  } catch (const std::exception&) {
  }
  return {k, v};
}

std::string candidate_str(const SpmdCandidate& c) {
  std::string s;
  for (const Placements& p : c.inputs) s += (s.empty() ? "" : " x ") + placements_str(p);
  return s + " -> " + placements_str(c.output);
}

Command explain_rule(CLI::App& app) {
  struct Args {
    std::string op, mesh;
    std::vector<std::string> inputs, attrs;
    std::vector<int> params;
    int top = 5;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "explain-rule", "print the layout an op's SPMD rule chooses for given input layouts, its cost, and the next-best candidates");
  cmd->add_option("op", a->op, "op name, e.g. softmax, matmul, sum")->required();
  cmd->add_option("--mesh", a->mesh, "the mesh: 2x2, or mesh(dp=2,tp=2)[[0,1],[2,3]]")->required();
  cmd->add_option("--input", a->inputs, "an input as SHAPE:PLACEMENTS[:DTYPE], e.g. 4,6,8:[S(2),S(0)] or 3,5:[R]:i64")
      ->required();
  cmd->add_option("--attr", a->attrs, "an attribute of the op as key=value, e.g. dim=-1, dims=1,2, keepdim=true");
  cmd->add_option("--param", a->params,
                  "input N (0-based) is a parameter: at equal cost the rule moves another input rather than it");
  cmd->add_option("--top", a->top, "candidates listed after the chosen one (default 5)");
  return {cmd, [a] {
            const OpDef* op = find_op(a->op);
            if (op == nullptr) throw BadInput(fmt::format("explain-rule: no op named '{}'", a->op));
            if (op->spmd == nullptr) throw BadInput(fmt::format("explain-rule: op '{}' has no SPMD rule", a->op));
            ProcessMesh mesh;
            std::vector<TensorMeta> metas;
            std::vector<DistAttr> attrs_in;
            Attrs attrs;
            try {
              mesh = a->mesh.starts_with("mesh(") ? ProcessMesh::parse(a->mesh) : ProcessMesh::iota(parse_shape(a->mesh));
              for (const std::string& in : a->inputs) {
                const size_t c1 = in.find(':');
                TESSEL_CHECK(c1 != std::string::npos, "--input '{}' is not SHAPE:PLACEMENTS[:DTYPE]", in);
                const size_t c2 = in.find(':', c1 + 1);
                TensorMeta m{c1 == 0 ? Shape{} : parse_shape(in.substr(0, c1)),
                             c2 == std::string::npos ? DType::f32 : parse_dtype(in.substr(c2 + 1)), {}};
                DistAttr d(mesh, parse_placements(in.substr(c1 + 1, c2 == std::string::npos ? std::string::npos : c2 - c1 - 1)));
                d.check(m.shape, "--input");
                metas.push_back(m);
                attrs_in.push_back(d);
              }
              for (const std::string& t : a->attrs) {
                auto [k, v] = parse_attr(t);
                attrs.set(k, v);
              }
              infer_op(*op, metas, attrs);  // the inputs and attrs must make a valid call
            } catch (const BadInput&) {
              throw;
            } catch (const Error& e) {
              throw BadInput(e.what());
            }
            SpmdAudit audit;
            spmd_audit() = &audit;
            SpmdDecision dec;
            try {
              SpmdCall call{op->name, metas, attrs_in, attrs, 0};
              for (int i : a->params) {
                if (i < 0 || i >= static_cast<int>(metas.size()) || i >= 64)
                  throw BadInput(fmt::format("--param {}: the call has inputs 0..{}", i, metas.size() - 1));
                call.params |= uint64_t{1} << i;
              }
              dec = op->spmd(call);
            } catch (...) {
              spmd_audit() = nullptr;
              throw;
            }
            spmd_audit() = nullptr;
            std::string ins;
            for (size_t i = 0; i < metas.size(); ++i)
              ins += fmt::format("{}{} {}", i ? ", " : "", metas[i].str(), placements_str(attrs_in[i].placements));
            std::printf("%s(%s) on %s\n", std::string(op->name).c_str(), ins.c_str(), mesh.str().c_str());
            if (dec.decompose != nullptr) std::printf("  the rule runs a composition of other ops on these inputs\n");
            double moved = 0;
            std::string chosen;
            for (size_t i = 0; i < dec.inputs.size() && i < metas.size(); ++i) {
              moved += plan_reshard(attrs_in[i], DistAttr(mesh, dec.inputs[i]), metas[i].shape, metas[i].dtype).cost;
              chosen += (chosen.empty() ? "" : " x ") + placements_str(dec.inputs[i]);
            }
            std::string outs;
            for (const Placements& p : dec.outputs) outs += (outs.empty() ? "" : ", ") + placements_str(p);
            std::printf("chosen: %s -> %s%s\n  moving the inputs costs %.0f (the reshard planner's bytes per rank, "
                        "4096 per collective)\n",
                        chosen.c_str(), outs.c_str(), dec.custom ? " (the dist layer's own implementation)" : "", moved);
            if (audit.entries.empty()) {
              std::printf("  the rule weighs no alternatives: its layout follows from the inputs'\n");
              return 0;
            }
            for (const SpmdAudit::Entry& e : audit.entries) {
              std::vector<size_t> order(e.candidates.size());
              for (size_t i = 0; i < order.size(); ++i) order[i] = i;
              std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
                return e.candidates[x].cost() < e.candidates[y].cost();
              });
              const SpmdCandidate& best = e.candidates[e.chosen];
              std::printf("label rule: %zu candidates weighed\n  chosen  %-48s cost %.0f (inputs %.0f, owed reductions %.0f)\n",
                          e.candidates.size(), candidate_str(best).c_str(), best.cost(), best.input_cost, best.owed_cost);
              int listed = 0;
              for (size_t i : order) {
                if (i == e.chosen) continue;
                if (listed++ >= a->top) break;
                const SpmdCandidate& c = e.candidates[i];
                std::printf("  next    %-48s cost %.0f (inputs %.0f, owed reductions %.0f)\n", candidate_str(c).c_str(), c.cost(),
                            c.input_cost, c.owed_cost);
              }
            }
            return 0;
          }};
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
           }},
          explain_rule(app)};
}

}  // namespace tessel
