// `tessel plan`: the best layouts of a model on a cluster, or one layout's estimate, with the
// breakdown of each; `--published` checks the cost model against the published runs of
// plan/published.h (Narayanan et al. 2021 Table 1, Megatron-Core r0.8 on H100, MT-NLG 530B,
// BLOOM 176B, Megatron-Core's Mixtral 8x7B).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tessel/cli/commands.h"
#include "tessel/cli/plan_support.h"
#include "tessel/core/error.h"
#include "tessel/engine/trace.h"
#include "tessel/plan/published.h"
#include "tessel/plan/traced.h"

namespace tessel {

namespace {

std::string gb(double bytes) { return fmt::format("{:.3g}", bytes / 1e9); }

void print_table(const std::vector<plan::Estimate>& plans, const plan::Cluster& c) {
  std::printf("software profile: %s\n", c.software.name.c_str());
  std::printf("%-3s %-78s %9s %11s %8s %6s %8s\n", "#", "layout", "step s", "tokens/s", "TFLOP/s", "MFU", "mem GB");
  int i = 0;
  for (const plan::Estimate& e : plans) {
    std::printf("%-3d %-78s %9.3f %11.0f %8.1f %5.1f%% %8s%s\n", ++i, e.layout.str().c_str(), e.step_time,
                e.tokens_per_s, e.tflops_per_device, 100 * e.mfu, gb(e.memory.total()).c_str(),
                e.fits ? "" : " (does not fit)");
    std::printf(
        "    time: compute %.3f s, tensor-parallel comm %.3f s, pipeline sends %.3f s, bubble %.3f s, "
        "data-parallel comm %.3f s, optimizer %.3f s%s\n",
        e.compute, e.tp_comm, e.pp_comm, e.bubble, e.dp_comm, e.optimizer,
        e.step_overhead > 0 ? fmt::format(", the software's fixed time per step {:.3f} s", e.step_overhead).c_str()
                            : "");
    if (e.layout.ep > 1 || e.layout.cp > 1)
      std::printf("          expert-parallel all_to_all %.3f s (the busiest rank's expert load %.3fx the mean), "
                  "context-parallel comm %.3f s\n",
                  e.ep_comm, e.expert_imbalance, e.cp_comm);
    if (e.cp_hidden > 0)
      std::printf("    ring transfers hidden behind the attention (not in the step): %.3f s\n", e.cp_hidden);
    if (e.tp_hidden > 0 || e.dp_hidden > 0)
      std::printf("    overlapped by the software (%s), not in the step: tensor-parallel comm %.3f s, data-parallel "
                  "comm %.3f s\n",
                  c.software.name.c_str(), e.tp_hidden, e.dp_hidden);
    std::printf("    memory (GB of %s): params %s, grads %s, optimizer %s, activations %s, reserved+fragmentation %s\n",
                gb(c.device.memory_bytes).c_str(), gb(e.memory.params).c_str(), gb(e.memory.grads).c_str(),
                gb(e.memory.optimizer).c_str(), gb(e.memory.activations).c_str(), gb(e.memory.other).c_str());
    std::printf("    ranks (innermost first): %s\n", fmt::format("{}", fmt::join(e.mapping.order, ", ")).c_str());
    for (const std::string& why : e.mapping.reasons()) std::printf("      %s\n", why.c_str());
  }
}

// A self-contained SVG: per plan a bar of the step split into its parts, and a bar of memory
// by kind against the device's capacity.
void write_svg(const std::string& path, const std::vector<plan::Estimate>& plans, const plan::Cluster& c,
               const std::string& title) {
  std::ofstream out(path);
  TESSEL_CHECK(out.good(), "--svg: cannot write '{}'", path);
  const int row = 64, left = 40, width = 560, top = 50;
  const int height = top + row * static_cast<int>(plans.size()) + 60;
  double max_time = 0;
  for (const plan::Estimate& e : plans) max_time = std::max(max_time, e.step_time);
  out << fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<text x=\"{}\" y=\"20\" font-size=\"14\">{}</text>\n",
      left + 2 * width + 80, height, left, title);
  out << fmt::format("<text x=\"{}\" y=\"40\">step time (s)</text><text x=\"{}\" y=\"40\">memory per device (GB of "
                     "{:.0f})</text>\n",
                     left, left + width + 40, c.device.memory_bytes / 1e9);
  const char* time_colors[] = {"#4878d0", "#ee854a", "#6acc64", "#d65f5f", "#956cb4", "#8c613c"};
  const char* time_names[] = {"compute", "tp/ep/cp comm", "pp sends", "bubble", "dp comm", "optimizer"};
  const char* mem_names[] = {"params", "grads", "optimizer", "activations", "other"};
  for (size_t i = 0; i < plans.size(); ++i) {
    const plan::Estimate& e = plans[i];
    const int y = top + row * static_cast<int>(i);
    out << fmt::format("<text x=\"{}\" y=\"{}\">#{} {} — {:.3g} s, {:.0f} tokens/s, MFU {:.1f}%</text>\n", left, y + 12,
                       i + 1, e.layout.str(), e.step_time, e.tokens_per_s, 100 * e.mfu);
    const double parts[] = {e.compute, e.tp_comm + e.ep_comm + e.cp_comm, e.pp_comm, e.bubble, e.dp_comm, e.optimizer};
    double x = left;
    for (int k = 0; k < 6; ++k) {
      const double w = max_time > 0 ? parts[k] / max_time * width : 0;
      out << fmt::format("<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"18\" fill=\"{}\"><title>{}: {:.4g} "
                         "s</title></rect>\n",
                         x, y + 18, w, time_colors[k], time_names[k], parts[k]);
      x += w;
    }
    const double mem[] = {e.memory.params, e.memory.grads, e.memory.optimizer, e.memory.activations, e.memory.other};
    x = left + width + 40;
    for (int k = 0; k < 5; ++k) {
      const double w = mem[k] / c.device.memory_bytes * width;
      out << fmt::format("<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"18\" fill=\"{}\"><title>{}: {:.3g} "
                         "GB</title></rect>\n",
                         x, y + 18, w, time_colors[k], mem_names[k], mem[k] / 1e9);
      x += w;
    }
    out << fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"18\" fill=\"none\" stroke=\"#333\"/>\n",
                       left + width + 40, y + 18, width);
  }
  int x = left;
  const int ly = top + row * static_cast<int>(plans.size()) + 20;
  for (int k = 0; k < 6; ++k) {
    out << fmt::format("<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{} / "
                       "{}</text>\n",
                       x, ly, time_colors[k], x + 14, ly + 9, time_names[k], k < 5 ? mem_names[k] : "-");
    x += 150;
  }
  out << "</svg>\n";
}

// --explain: the step of the first plan taken apart — the step's parts as the planner costs
// them, and one dense block op by op and collective by collective from its trace.
void print_explain(const plan::Estimate& e, const plan::ModelSpec& m, const plan::Cluster& c) {
  std::printf("\nExplained: %s, %s on %s (software %s): %.4g s per step, the busiest pipeline rank\n",
              m.name.c_str(), e.layout.str().c_str(), c.name.c_str(), c.software.name.c_str(), e.step_time);
  std::printf(
      "  compute %.4g s, pipeline bubble %.4g s, optimizer %.4g s, fixed time per step %.4g s (software "
      "profile's step_overhead)\n",
      e.compute, e.bubble, e.optimizer, e.step_overhead);
  std::printf("  communication exposed: tp %.4g s, ep %.4g s, cp %.4g s, pp %.4g s, dp %.4g s; hidden behind compute: "
              "tp %.4g s, dp %.4g s, cp %.4g s\n",
              e.tp_comm, e.ep_comm, e.cp_comm, e.pp_comm, e.dp_comm, e.tp_hidden, e.dp_hidden, e.cp_hidden);
  std::printf("  memory per device: parameters %s GB, gradients %s GB, optimizer states %s GB, activations %s GB, other "
              "%s GB, total %s GB\n",
              gb(e.memory.params).c_str(), gb(e.memory.grads).c_str(), gb(e.memory.optimizer).c_str(),
              gb(e.memory.activations).c_str(), gb(e.memory.other).c_str(), gb(e.memory.total()).c_str());
  if (!e.step_collectives.empty()) {
    std::printf("  the step's collectives as traced on world rank %d (tessel's runtime; dp and pp traffic is timed from "
                "them): %-5s %-16s %6s %12s\n",
                e.traced_rank, "dim", "kind", "calls", "bytes");
    for (const plan::TracedCollective& x : e.step_collectives)
      std::printf("      %-5s %-16s %6lld %12lld\n", x.dim.c_str(), x.kind.c_str(), static_cast<long long>(x.calls),
                  static_cast<long long>(x.bytes));
  }
  // A mixture of experts: one of its sparse blocks.
  plan::LayerShape block = e.block;
  block.moe = m.is_moe();
  if (!plan::traceable(m, block)) {
    std::printf("  (this block is costed from the cost model's list of ops: --costs listed)\n");
    return;
  }
  std::vector<plan::OpTime> ops;
  const plan::LayerCost lc = plan::traced_layer_cost(m, c, block, &ops);
  std::string dims = fmt::format("tp {}{}", block.tp, block.sp ? " sp" : "");
  if (block.moe && block.ep > 1) dims += fmt::format(", ep {}", block.ep);
  if (block.cp > 1) dims += fmt::format(", cp {} {}", block.cp, block.cp_method);
  std::printf("  one %sblock, one micro-batch of %lld sequences (%s), as traced on rank 0: forward %.4g ms, "
              "backward %.4g ms, recompute %.4g ms\n",
              block.moe ? "sparse " : "", static_cast<long long>(block.micro_batch), dims.c_str(), 1e3 * lc.fwd,
              1e3 * (lc.bwd_input + lc.bwd_weight), 1e3 * lc.recompute);
  if (block.moe)
    std::printf("  its experts traced with a balanced router (tokens x top_k / experts rows each); the busiest "
                "expert rank's load is %.4g times that (the model's imbalance)\n", lc.imbalance);
  std::stable_sort(ops.begin(), ops.end(), [](const plan::OpTime& a, const plan::OpTime& b) { return a.seconds > b.seconds; });
  std::printf("    %-16s %-10s %6s %12s %12s %10s\n", "op", "pass", "calls", "GFLOP", "MB", "ms");
  for (const plan::OpTime& o : ops)
    if (o.seconds > 0)
      std::printf("    %-16s %-10s %6lld %12.4g %12.4g %10.4g\n", o.op.c_str(), o.pass.c_str(),
                  static_cast<long long>(o.calls), o.flops / 1e9, o.bytes / 1e6, 1e3 * o.seconds);
  const plan::BlockTrace& bt = plan::traced_block(m, block);
  if (!bt.comm.empty()) {
    std::printf("    its collectives per micro-batch (as traced, f32): %-4s %-16s %6s %12s\n", "dim", "kind", "calls", "bytes");
    for (const plan::TracedCollective& x : bt.comm)
      std::printf("      %-4s %-16s %6lld %12lld\n", x.dim.c_str(), x.kind.c_str(), static_cast<long long>(x.calls),
                  static_cast<long long>(x.bytes));
    std::printf("    tensor-parallel exposed %.4g ms forward, %.4g ms backward, hidden %.4g ms (group of %d, %d per node)\n",
                1e3 * lc.tp_fwd, 1e3 * lc.tp_bwd, 1e3 * lc.tp_hidden, block.tp_group.size, block.tp_group.per_node);
    if (block.moe && block.ep > 1)
      std::printf("    expert-parallel exposed %.4g ms forward, %.4g ms backward (group of %d, %d per node)\n",
                  1e3 * lc.ep_fwd, 1e3 * lc.ep_bwd, block.ep_group.size, block.ep_group.per_node);
    if (block.cp > 1)
      std::printf("    context-parallel (%s) exposed %.4g ms forward, %.4g ms backward, hidden behind the attention "
                  "%.4g ms (group of %d, %d per node)\n",
                  block.cp_method.c_str(), 1e3 * lc.cp_fwd, 1e3 * lc.cp_bwd, 1e3 * lc.cp_hidden, block.cp_group.size,
                  block.cp_group.per_node);
  }
}

int run_published(const std::string& format, int threads) {
  Json all = Json::Array{};
  for (const plan::PublishedTable& t : plan::published_tables()) {
    const bool model_count = !t.rows.empty() && t.rows.front().model_flops;
    const std::string sample = t.calibrates.empty() ? "out of sample: nothing is fitted to this table"
                                                    : "in sample: this table sets " + t.calibrates;
    if (format == "table")
      std::printf(
          "%s\n  %s\n  software profile: %s\n  %s\n  %s TFLOP/s per GPU as published, as predicted for the "
          "published layout, and for the planner's best plan\n%-16s %6s %-42s %9s %9s %7s %8s %10s %-44s %9s\n",
          t.name.c_str(), t.source.c_str(), t.rows.empty() ? "-" : t.rows.front().software.c_str(), sample.c_str(),
          model_count ? "model" : "hardware", "model", "GPUs", "published layout", "published", "predicted", "error",
          "mem GB", "best", "best layout", "best mem");
    double sum = 0, worst = 0;
    for (const plan::PublishedRun& r : t.rows) {
      const plan::Cluster c = plan::published_cluster(r);
      const plan::ModelSpec m = plan::model_preset(r.model);
      const plan::Estimate e = plan::evaluate(m, c, r.layout, r.global_batch);
      // In the source's count: model FLOPs, or hardware FLOPs with the layout's recomputation.
      const double flops = plan::step_flops(m, r.global_batch, r.model_flops ? "none" : r.layout.recompute);
      const double predicted = flops / e.step_time / c.devices() / 1e12;
      plan::PlanOptions o;
      o.global_batch = r.global_batch;
      o.top = 1;
      o.threads = threads;
      const plan::SearchResult s = plan::search(m, c, o);
      const double err = predicted / r.tflops_per_device - 1;
      sum += std::abs(err);
      worst = std::max(worst, std::abs(err));
      const plan::Estimate* best = s.best.empty() ? nullptr : &s.best.front();
      const double best_tflops = best ? (r.model_flops ? plan::step_flops(m, r.global_batch, "none")
                                                       : plan::step_flops(m, r.global_batch, best->layout.recompute)) /
                                            best->step_time / c.devices() / 1e12
                                      : 0.0;
      if (format == "table") {
        std::printf(
            "%-16s %6d %-42s %9.1f %9.1f %+6.1f%% %8s %10.1f %-44s %9s\n", r.model.c_str(), c.devices(),
            fmt::format("dp={},tp={},pp={},vpp={}{},mbs={},gbs={}", r.layout.dp, r.layout.tp, r.layout.pp, r.layout.vpp,
                        r.layout.ep > 1 ? fmt::format(",ep={}", r.layout.ep) : "", r.layout.micro_batch, r.global_batch)
                .c_str(),
            r.tflops_per_device, predicted, 100 * err, gb(e.memory.total()).c_str(), best_tflops,
            best ? fmt::format("dp={},tp={},pp={},vpp={},mbs={},z{},{}{}{}", best->layout.dp, best->layout.tp,
                               best->layout.pp, best->layout.vpp, best->layout.micro_batch, best->layout.sharding_stage,
                               best->layout.recompute, best->layout.sp ? ",sp" : "",
                               best->layout.ep > 1 ? fmt::format(",ep={}", best->layout.ep) : "")
                       .c_str()
                 : "none fits",
            best ? gb(best->memory.total()).c_str() : "-");
      }
      Json j = Json::Object{};
      j["table"] = t.name;
      j["calibrates"] = t.calibrates;
      j["model"] = r.model;
      j["cluster"] = r.cluster;
      j["software"] = r.software;
      j["published_tflops_per_device"] = r.tflops_per_device;
      j["predicted_tflops_per_device"] = predicted;
      j["tflops_count"] = r.model_flops ? "model" : "hardware";
      j["predicted"] = e.to_json();
      if (best) j["best"] = best->to_json();
      all.push_back(j);
    }
    if (format == "table")
      std::printf("%s: mean absolute error %.1f%%, max %.1f%% over %zu rows\n\n", t.name.c_str(),
                  100 * sum / static_cast<double>(t.rows.size()), 100 * worst, t.rows.size());
  }
  if (format != "table") std::printf("%s\n", all.dump().c_str());
  return 0;
}

}  // namespace

std::vector<Command> register_plan(CLI::App& app) {
  struct Args {
    std::string model, cluster, format = "table", layout, svg, software, costs = "traced";
    int64_t global_batch = 0, seq_len = 0;
    int top = 5, threads = 0;
    bool published = false, quiet = false, explain = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "predict step time, throughput and memory of parallel layouts and pick the best");
  cmd->footer(fmt::format(
      "Model presets: {}.\nCluster presets (append :N for N devices): {}; local[:N] measures this machine for N thread "
      "ranks; or a cluster YAML file (see `tessel cluster detect`).\nExamples:\n  tessel plan --model gpt-1t --cluster "
      "dgx-a100-80g:3072 --global-batch 3072\n  tessel plan --model gpt-1t --cluster dgx-a100-80g:3072 --global-batch "
      "3072 --layout dp=6,tp=8,pp=64,vpp=2,mbs=1,recompute=full\n  tessel plan --model configs/gpt2-tiny.yaml --cluster "
      "local:4 --format yaml\n  tessel plan --published",
      fmt::join(plan::model_preset_names(), ", "), fmt::join(plan::cluster_preset_names(), ", ")));
  cmd->add_option("--model", a->model, "a model preset or a training config (YAML)");
  cmd->add_option("--cluster", a->cluster, "PRESET:N, local[:N] or a cluster YAML file");
  cmd->add_option("--software", a->software,
                  fmt::format("the software profile the stack runs (default: the cluster's; {})",
                              fmt::join(plan::software_profile_names(), ", ")))
      ->check(CLI::IsMember(plan::software_profile_names()));
  cmd->add_option("--global-batch", a->global_batch, "sequences per step (default: the config's train.global_batch)")
      ->check(kPositiveCount);
  cmd->add_option("--seq-len", a->seq_len, "sequence length (default: the preset's or the config's)")
      ->check(kPositiveCount);
  cmd->add_option("--top", a->top, "how many plans to show (default 5)")->check(kPositiveCount);
  cmd->add_option("--format", a->format, "table, json (every plan with its parts) or yaml (the best plan as the "
                                         "parallel: section of a training config)")
      ->check(CLI::IsMember({"table", "json", "yaml"}));
  CLI::Option* layout = cmd->add_option("--layout", a->layout,
                  "evaluate this layout instead of searching, e.g. dp=6,tp=8,pp=64,vpp=2,mbs=1,sharding_stage=0,"
                  "sp=false,recompute=full (schedule=1F1B|VPP|ZBH1|FThenB)");
  cmd->add_option("--svg", a->svg, "also draw the plans (time and memory bars) into this SVG file");
  CLI::Option* published =
      cmd->add_flag("--published", a->published,
                    "compare predictions with the published runs (Narayanan et al. 2021 Table 1, "
                    "Megatron-Core r0.8 on H100, MT-NLG 530B, BLOOM 176B, Megatron-Core's Mixtral "
                    "8x7B), each with its software profile, saying which tables set a calibration, "
                    "and show the planner's best plan for each row");
  for (const char* name : {"--model", "--cluster", "--global-batch", "--seq-len", "--layout", "--svg", "--software"})
    published->excludes(cmd->get_option(name));  // the Table 1 rows fix all of these
  cmd->add_option(
         "--threads", a->threads,
         "threads screening the candidates (default: TESSEL_NUM_THREADS, else the usable cores); the plans are "
         "the same on any number")
      ->check(kPositiveCount);
  cmd->add_flag("--quiet", a->quiet, "no progress lines while measuring this machine");
  cmd->add_flag("--explain", a->explain,
                "take the (first) plan apart: compute, bubble, optimizer, each communication exposed and hidden, "
                "memory by kind, and one block op by op with its collectives, from its trace (table format)");
  cmd->add_option("--costs", a->costs,
                  "where a block's costs come from: traced (the runtime's step run on shapes alone, the default) or "
                  "listed (the cost model's own list of a block's ops, the planner before tracing)")
      ->check(CLI::IsMember({"traced", "listed"}));
  return {{cmd, [a, layout] {
             if (a->explain && (a->published || a->format != "table"))
               throw BadInput(a->published ? "--explain takes a plan apart; with --published there is none (give "
                                             "--model and --cluster)"
                                           : fmt::format("--explain prints tables; --format {} has no place for it "
                                                         "(use the default --format table)", a->format));
             if (a->costs == "traced") install_block_tracer();
             else plan::set_block_tracer(nullptr);
             if (a->published) return run_published(a->format, a->threads);
             if (a->model.empty() || a->cluster.empty())
               throw BadInput("tessel plan needs --model and --cluster (or --published); see tessel plan --help");
             RunConfig config;
             // Checked before the cluster is resolved: `local` measures this machine, which takes seconds.
             if (!a->svg.empty()) {
               const std::filesystem::path dir = std::filesystem::absolute(a->svg).parent_path();
               if (!std::filesystem::is_directory(dir))
                 throw BadInput(fmt::format("--svg {}: the folder {} does not exist", a->svg, dir.string()));
             }
             plan::ModelSpec m;
             plan::Cluster c;
             try {
               m = resolve_model(a->model, &config);
               c = resolve_cluster(a->cluster, !a->quiet && a->format == "table");
               if (!a->software.empty()) c.software = plan::software_profile(a->software);
             } catch (const Error& e) {
               throw BadInput(e.what());
             }
             const bool preset = plan::is_model_preset(a->model);
             if (a->seq_len > 0) {
               const int64_t positions = config.model.arch == "gpt2" ? config.model.gpt2.n_positions
                                                                      : config.model.llama.max_position_embeddings;
               if (!preset && a->seq_len > positions)
                 throw BadInput(fmt::format("--seq-len {} exceeds the model's {} positions ({})", a->seq_len, positions,
                                            a->model));
               m.seq = a->seq_len;
             }
             int64_t batch = a->global_batch;
             if (batch == 0 && !preset) batch = config.train.global_batch;
             if (batch == 0) throw BadInput("--global-batch is required with a model preset");
             std::vector<plan::Estimate> plans;
             Json search_info = Json::Object{};
             if (layout->count() > 0) {
               try {
                 plans.push_back(plan::evaluate(m, c, plan::parse_layout(a->layout, batch, c.devices()), batch));
               } catch (const Error& e) {
                 throw BadInput(e.what());
               }
             } else {
               plan::PlanOptions o;
               o.global_batch = batch;
               o.top = a->top;
               o.threads = a->threads;
               plan::SearchResult r = plan::search(m, c, o);
               if (r.candidates == 0)
                 throw BadInput(fmt::format(
                     "no layout of {} fits the shape of {} devices and global batch {}: dp x tp x pp must be the "
                     "device count, dp must divide the global batch, tp the {} heads and pp the {} layers",
                     m.name, c.devices(), batch, m.heads, m.layers));
               if (r.best.empty())
                 throw BadInput(fmt::format("no layout of {} on {} devices fits in {} GB per device ({} layouts tried)",
                                            m.name, c.devices(), c.device.memory_bytes / 1e9, r.candidates));
               plans = r.best;
               search_info["candidates"] = r.candidates;
               search_info["feasible"] = r.feasible;
               search_info["simulated"] = r.simulated;
               search_info["seconds"] = r.seconds;
               if (a->format == "table")
                 std::printf("%s (%.3g B parameters, seq %lld) on %s: %d devices of %s, global batch %lld; searched "
                             "%lld layouts (%lld fit, %lld schedules played) in %.2f s\n",
                             m.name.c_str(), m.parameters() / 1e9, static_cast<long long>(m.seq), c.name.c_str(),
                             c.devices(), c.device.name.c_str(), static_cast<long long>(batch),
                             static_cast<long long>(r.candidates), static_cast<long long>(r.feasible),
                             static_cast<long long>(r.simulated), r.seconds);
             }
             if (!a->svg.empty())
               write_svg(a->svg, plans, c, fmt::format("{} on {} ({} devices), global batch {}", m.name, c.name,
                                                       c.devices(), batch));
             if (a->format == "json") {
               Json j = Json::Object{};
               j["model"] = m.name;
               j["parameters"] = m.parameters();
               j["cluster"] = c.name;
               j["software"] = c.software.name;
               j["devices"] = c.devices();
               j["global_batch"] = batch;
               j["seq_len"] = m.seq;
               j["search"] = search_info;
               Json list = Json::Array{};
               for (const plan::Estimate& e : plans) list.push_back(e.to_json());
               j["plans"] = list;
               std::printf("%s\n", j.dump().c_str());
             } else if (a->format == "yaml") {
               const plan::Estimate& e = plans.front();
               std::printf("# tessel plan: %s on %s, global batch %lld: %.4g s/step, %.0f tokens/s, %.1f TFLOP/s per "
                           "device, MFU %.1f%%, %.1f GB per device\n# ranks innermost first: %s\n%s",
                           m.name.c_str(), c.name.c_str(), static_cast<long long>(batch), e.step_time, e.tokens_per_s,
                           e.tflops_per_device, 100 * e.mfu, e.memory.total() / 1e9,
                           fmt::format("{}", fmt::join(e.mapping.order, ", ")).c_str(),
                           plan::parallel_yaml(e.layout).c_str());
             } else {
               print_table(plans, c);
               if (m.is_moe() && m.capacity_factor == 0)
                 std::printf(
                     "note: dropless routing: the memory above assumes a router its balancing loss keeps even; a "
                     "freshly initialised router's first steps can hold more (Mixtral tiny with ep 2: +24%% at "
                     "step 2, docs/plan.md); model.capacity_factor bounds it\n");
               if (a->explain) print_explain(plans.front(), m, c);
             }
             return 0;
           }}};
}

}  // namespace tessel
