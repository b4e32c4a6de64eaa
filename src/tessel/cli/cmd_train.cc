// `tessel train` and `tessel bench train`.
#include <unistd.h>

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>

#include "tessel/cli/bench_train.h"
#include "tessel/cli/commands.h"
#include "tessel/engine/engine.h"
#include "tessel/cli/plan_support.h"
#include "tessel/cli/cluster_detect.h"
#include "tessel/ckpt/checkpoint.h"
#include "tessel/ckpt/sharded.h"
#include "tessel/comm/gloo_backend.h"
#include "tessel/comm/store.h"
#include "tessel/comm/world.h"
#include "tessel/core/input_file.h"
#include "tessel/core/log.h"
#include "tessel/launch/launcher.h"

namespace tessel {

namespace {

// The metrics file (`from`: the flag or key that named it) can be written: opened for appending
// (created when missing, never truncated here: a resume keeps its lines), else the reason.
void check_metrics_file(const std::string& path, const char* from) {
  if (path.empty()) return;
  struct stat st {};
  const bool existed = ::stat(path.c_str(), &st) == 0;
  if (existed && S_ISDIR(st.st_mode))
    throw BadInput(fmt::format("{}: cannot write metrics file '{}': it is a folder; name a file in it", from, path));
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0)
    throw BadInput(fmt::format("{}: cannot write metrics file '{}': {}", from, path, std::strerror(errno)));
  ::close(fd);
  if (!existed) ::unlink(path.c_str());  // the run makes it; a run refused later leaves nothing
}

// A model whose f32 weights alone, split over every rank the layout has (the most any layout
// splits them), exceed this machine's memory cannot train here: refused naming the sizes that
// make it so, with what it needs against what there is, before anything is allocated.
void check_model_fits(const RunConfig& cfg) {
  auto format_bytes = [](double b) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    while (b >= 1024 && u < 6) b /= 1024, ++u;
    return fmt::format("{:.1f} {}", b, units[u]);
  };
  const plan::ModelSpec spec = model_spec_of(cfg);
  const double params = spec.parameters();
  const double need = params * 4 / static_cast<double>(std::max<int64_t>(1, cfg.parallel.world_size()));
  const double have = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE));
  if (have <= 0 || need <= have) return;
  const bool gpt2 = cfg.model.arch == "gpt2";
  const double embedding = static_cast<double>(spec.vocab) * static_cast<double>(spec.hidden);
  const std::string width = gpt2 ? "model.n_embd" : "model.hidden_size";
  const std::string sizes =
      embedding * 2 >= params
          ? fmt::format("'model.vocab_size' ({}) x '{}' ({})", spec.vocab, width, spec.hidden)
          : fmt::format("'{}' ({}) x '{}' ({})", gpt2 ? "model.n_layer" : "model.num_hidden_layers", spec.layers, width,
                        spec.hidden);
  throw BadInput(fmt::format("config {}: the model's {:.3g} parameters need {} for their f32 weights alone{}; this "
                             "machine has {} of memory",
                             sizes, params, format_bytes(need),
                             cfg.parallel.world_size() > 1
                                 ? fmt::format(" (split over all {} ranks)", cfg.parallel.world_size())
                                 : std::string(),
                             format_bytes(have)));
}

RunConfig load_or_bad_input(const std::string& path, const std::vector<std::string>& sets) {
  RunConfig cfg;
  try {
    cfg = load_run_config(path, sets);
  } catch (const Error& e) {
    throw BadInput(e.what());
  }
  // Files the run reads are the user's to fix (exit 2), before any rank starts. Looked at with
  // stat, never opened here: opening a named pipe would wait for a writer forever.
  for (const auto& [key, file] : {std::pair<const char*, const std::string&>{"data.path", cfg.data.path},
                                  {"data.val_path", cfg.data.val_path},
                                  {"model.init_from", cfg.model.init_from}}) {
    if (file.empty()) continue;
    std::string problem = input_file_problem(file);
    if (problem.empty() && ::access(file.c_str(), R_OK) != 0) problem = "not a readable file";
    if (!problem.empty())
      throw BadInput(fmt::format("{}: config {} names '{}', which cannot be read ({})", path, key, shown_path(file),
                                 problem));
  }
  return cfg;
}

int env_count(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : 0;
}

// A layout for the world `tessel launch` started when the config's does not fit it (an
// elastic job's round with fewer or more nodes) or when --plan auto asks: rank 0 plans —
// measuring this machine as `tessel cluster detect` does, while the other ranks wait — and
// hands the layout to them through the job's store, so every rank runs the same one. The
// global batch stays; the planner changes the micro-batches to keep it. The measurement is
// kept in the store outside the round's namespace, so a later round of the same job with the
// same number of ranks plans at once.
void plan_for_launched_world(RunConfig& cfg, const std::string& why) {
  const GlooWorldOptions w = GlooWorldOptions::from_env(default_timeout());
  const std::shared_ptr<Store> job_store = connect_job_store(w, /*round_namespace=*/false);
  const std::shared_ptr<Store> store = connect_job_store(w);
  const std::string key = "plan/layout";
  std::string text;
  if (w.rank == 0) {
    try {
      const std::string measured_key = fmt::format("plan/measured-cluster/{}", w.size);
      std::optional<plan::Cluster> measured;
      if (job_store->check({measured_key})) {
        measured = plan::parse_cluster(job_store->get(measured_key), "measured earlier in this job");
      } else {
        measured = local_cluster(w.size, false);
        job_store->set(measured_key, measured->to_yaml());
      }
      const plan::Estimate e = auto_layout(cfg, w.size, false, &*measured);
      text = fmt::format("{}\n{}", e.layout.str(), e.layout.bucket_mb);
      log_info("{}: the planner chose {} for {} ranks, gradient buckets of {} MiB (predicted {:.3f} s/step, {:.2f} GB "
               "per rank); the global batch of {} stays, as {} micro-batch{} per replica",
               why, e.layout.str(), w.size, e.layout.bucket_mb, e.step_time, e.memory.total() / 1e9,
               cfg.train.global_batch, e.layout.micro_batches, e.layout.micro_batches == 1 ? "" : "es");
    } catch (const Error& err) {
      store->set(key, std::string("error: ") + err.what());
      throw BadInput(fmt::format("{}: {}", why, err.what()));
    }
    store->set(key, text);
  } else {
    // Rank 0 measures the machine first: wait longer than a collective would.
    text = store->get(key, std::max(w.timeout, Millis(300'000)));
    if (text.rfind("error: ", 0) == 0) throw BadInput(fmt::format("{}: rank 0 found no layout: {}", why, text.substr(7)));
  }
  const std::size_t nl = text.find('\n');
  plan::Layout layout = plan::parse_layout(text.substr(0, nl), cfg.train.global_batch, w.size);
  if (nl != std::string::npos) layout.bucket_mb = std::stod(text.substr(nl + 1));
  apply_layout(cfg, layout);
}
}  // namespace

std::vector<Command> register_train(CLI::App& app) {
  struct Args {
    std::string config, metrics, save, resume, trace, backend = "thread", plan, device;
    std::vector<std::string> sets;
    int nproc = 0;
    double timeout = 0;
    CLI::Option* timeout_opt = nullptr;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("train", "train a model from a YAML config");
  cmd->add_option("--plan", a->plan,
                  "auto: let the planner choose the parallel section for --nproc thread ranks (default: one per core) "
                  "on this machine, measured as `tessel cluster detect` does, or for the ranks `tessel launch` started "
                  "(--backend gloo: rank 0 plans for all); replaces the config's parallel section")
      ->check(CLI::IsMember({"auto"}));
  cmd->add_option("config", a->config, "training config (YAML)")->required();
  cmd->add_option("--set", a->sets, "override a config value, e.g. --set train.lr=3e-4 (repeatable)");
  cmd->add_option("--metrics", a->metrics, "write one JSON line of metrics per step to this file");
  cmd->add_option("--save", a->save,
                  "write checkpoints to DIR/step-NNNNNN/; then Ctrl-C or SIGTERM stops the run after the step in "
                  "progress with a checkpoint of it (one rank)");
  cmd->add_option("--resume", a->resume, "resume from a step folder, or the newest one under DIR");
  cmd->add_option("--nproc", a->nproc,
                  "ranks to run on the thread backend (default: dp·tp·pp of the config's parallel section)")
      ->check(kPositiveCount);
  cmd->add_option("--backend", a->backend,
                  "thread: --nproc ranks in this process; gloo: this process is one rank started by `tessel launch`")
      ->check(CLI::IsMember({"thread", "gloo"}));
  cmd->add_option("--trace", a->trace, "write a Chrome-trace/Perfetto timeline (one row per rank) to this JSON file");
  cmd->add_option("--device", a->device,
                  "where the model and the step run: cpu, cuda (each local rank its GPU) or guarded (the CPU test "
                  "device that host code may not read; docs/devices.md); the same as --set train.device=...")
      ->check(CLI::IsMember({"cpu", "cuda", "guarded"}));
  a->timeout_opt = cmd->add_option("--timeout", a->timeout,
                                   "seconds a collective or store call waits for the other ranks before the run fails "
                                   "naming them (overrides the config's parallel.timeout_s)")
                       ->default_str("parallel.timeout_s, else tessel launch's --timeout, else 300");
  return {{cmd, [a] {
             if (!a->device.empty()) a->sets.push_back("train.device=" + a->device);
             RunConfig cfg = load_or_bad_input(a->config, a->sets);
             try {
               set_default_timeout(a->timeout_opt->count() > 0 ? timeout_from_seconds(a->timeout, "--timeout")
                                   : cfg.timeout_s > 0 ? timeout_from_seconds(cfg.timeout_s, "parallel.timeout_s")
                                                       : default_timeout());
             } catch (const Error& e) {
               throw BadInput(e.what());
             }
             if (a->backend == "gloo") {
               // Under an elastic `tessel launch`, a round's world may not be the config's.
               const int world = env_count("WORLD_SIZE");
               if (a->plan == "auto")
                 plan_for_launched_world(cfg, "--plan auto");
               else if (std::getenv("TESSEL_ELASTIC") != nullptr && *std::getenv("TESSEL_ELASTIC") != '\0' &&
                        world != cfg.parallel.world_size())
                 plan_for_launched_world(
                     cfg, fmt::format("elastic round {}: {} ranks, but the config's parallel section (dp {}, tp {}, "
                                      "pp {}) needs {}",
                                      env_count("TESSEL_ELASTIC_ROUND"), world, cfg.parallel.dp, cfg.parallel.tp,
                                      cfg.parallel.pp, cfg.parallel.world_size()));
             } else if (a->plan == "auto") {
               const int nproc = a->nproc > 0 ? a->nproc : static_cast<int>(probe_topology().cores);
               plan::Estimate e;
               try {
                 e = auto_layout(cfg, nproc, true);
               } catch (const Error& err) {
                 throw BadInput(err.what());
               }
               apply_layout(cfg, e.layout);
               log_info("--plan auto: {} (predicted {:.3f} s/step, {:.0f} tokens/s, {:.2f} GB per rank); as a config:\n{}",
                        e.layout.str(), e.step_time, e.tokens_per_s, e.memory.total() / 1e9,
                        plan::parallel_yaml(e.layout));
             }
             const int64_t ranks = cfg.parallel.world_size();
             TrainOptions base{.metrics_path = a->metrics, .save_dir = a->save, .resume_dir = a->resume,
                                     .stop_on_signal = true};
             if (cfg.train.memory_save_every > 0) {
               const char* token = std::getenv("TESSEL_JOB_TOKEN");
               base.memory_dir = !cfg.train.memory_dir.empty() ? cfg.train.memory_dir
                                 : token != nullptr && *token != '\0' ? job_memory_dir(token)
                                                                      : std::string();
               if (base.memory_dir.empty())
                 throw BadInput("train.memory_save_every keeps checkpoints in memory for restarts by `tessel launch`; "
                                "run under it, or give train.memory_dir");
             }
             // Restarted by `tessel launch --max-restarts`, or a later round of an elastic job:
             // go on from the newest complete checkpoint of --save (or of the in-memory ones),
             // when there is one.
             if (const int restart = env_count("TESSEL_RESTART_COUNT"), round = env_count("TESSEL_ELASTIC_ROUND");
                 (restart > 0 || round > 0) && base.resume_dir.empty() &&
                 (!base.save_dir.empty() || !base.memory_dir.empty())) {
               base.resume_dir = !base.save_dir.empty() ? base.save_dir : base.memory_dir;
               base.resume_optional = true;
               log_info("{}: resuming from the newest complete checkpoint in {}{}",
                        round > 0 ? fmt::format("elastic round {}", round) : fmt::format("restart {}", restart),
                        base.resume_dir, base.memory_dir.empty() ? "" : " or in memory, if any");
             }
             // A folder it cannot write or a checkpoint that is not there is the user's to fix
             // (exit 2), before any step.
             try {
               check_model_fits(cfg);
               check_metrics_file(a->metrics.empty() ? cfg.log.metrics : a->metrics,
                                  a->metrics.empty() ? "config 'log.metrics'" : "--metrics");
               if (!base.save_dir.empty()) check_checkpoint_dir(base.save_dir);
               if (!base.resume_dir.empty() && !base.resume_optional) resolve_checkpoint(base.resume_dir);
             } catch (const Error& e) {
               throw BadInput(e.what());
             }
             // Every layout, one rank included, runs on the engine.
             const ParallelTrainOptions po{.base = base, .trace_path = a->trace};
             ParallelTrainResult r;
             if (a->backend == "gloo") {
               auto world = init_world(WorldOptions{.backend = "gloo"});
               if (world->size() != ranks)
                 throw BadInput(fmt::format("the config's parallel section needs dp·ep·cp·tp·pp = {} ranks but "
                                            "`tessel launch` started {}{}",
                                            ranks, world->size(), parallel::expert_world_note(cfg.parallel)));
               r = Engine(cfg).fit(po);
             } else {
               const int nproc = a->nproc > 0 ? a->nproc : static_cast<int>(ranks);
               if (nproc != ranks)
                 throw BadInput(fmt::format(
                     "--nproc {} but the config's parallel section ({}) needs {} rank{}; give the layout (e.g. --set "
                     "parallel.dp={}) or let --plan auto choose one for {} ranks{}",
                     nproc, cfg.parallel.degrees_str(), ranks, ranks == 1 ? "" : "s", nproc, nproc,
                     parallel::expert_world_note(cfg.parallel)));
               r = train_parallel_threads(cfg, nproc, po);
             }
             if (r.train.stopped_by != 0) return 128 + r.train.stopped_by;  // the shell's convention for a signal
             if (!r.train.steps.empty() && (a->backend != "gloo" || world_group()->rank() == 0))
               log_info("done: {} step{} in {:.1f}s, final loss {:.4f}", r.train.steps.size(),
                        r.train.steps.size() == 1 ? "" : "s", r.train.seconds, r.train.steps.back().loss);
             return 0;
           }}};
}

std::vector<Command> register_bench_train(CLI::App& bench) {
  struct Args {
    std::string config;
    std::vector<std::string> sets;
    TrainBenchOptions opts;
    int threads = 0;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand("train", "training tokens/s and model FLOP/s beside the sgemm peak");
  cmd->add_option("config", a->config, "training config (YAML)")->required();
  cmd->add_option("--set", a->sets, "override a config value (repeatable)");
  cmd->add_option("--steps", a->opts.steps, "measured steps (median reported)")->check(kPositiveCount);
  cmd->add_option("--warmup", a->opts.warmup, "unmeasured warm-up steps")->check(kNonNegativeCount);
  cmd->add_option("--threads", a->threads, "intra-op and BLAS threads (default or 0: the config's, else all)")
      ->check(kNonNegativeCount);
  cmd->add_flag("--json", a->json, "print one JSON object instead of a table");
  return {{cmd, [a] {
             RunConfig cfg = load_or_bad_input(a->config, a->sets);
             if (a->threads > 0) cfg.train.threads = a->threads;
             Json j = bench_train(cfg, a->opts);
             if (a->json) {
               std::printf("%s\n", j.dump().c_str());
               return 0;
             }
             std::printf("tessel bench train %s (%s, %.2fM parameters, %lld threads)\n", a->config.c_str(),
                         j.at("arch").as_string().c_str(), static_cast<double>(j.at("parameters").as_int()) / 1e6,
                         static_cast<long long>(j.at("threads").as_int()));
             std::printf("  step time (median of %lld)   %.4f s\n", static_cast<long long>(a->opts.steps),
                         j.at("step_time_s").as_double());
             std::printf("  tokens/s                    %.0f\n", j.at("tokens_per_s").as_double());
             std::printf("  model FLOP/s                %.2f GFLOP/s  (6·N + attention per token)\n",
                         j.at("model_flops_per_s").as_double() / 1e9);
             std::printf("  sgemm peak, same threads    %.2f GFLOP/s  (sampled after every step)\n",
                         j.at("sgemm_peak_flops_per_s").as_double() / 1e9);
             std::printf("  share of sgemm peak         %.1f%%  (median of per-step ratios)\n",
                         100 * j.at("share_of_sgemm_peak").as_double());
             return 0;
           }}};
}

}  // namespace tessel
