// `tessel train` and `tessel bench train`.
#include <cstdio>

#include "tessel/cli/bench_train.h"
#include "tessel/cli/commands.h"
#include "tessel/cli/trainer.h"
#include "tessel/core/log.h"

namespace tessel {

namespace {
RunConfig load_or_bad_input(const std::string& path, const std::vector<std::string>& sets) {
  try {
    return load_run_config(path, sets);
  } catch (const Error& e) {
    throw BadInput(e.what());
  }
}
}  // namespace

std::vector<Command> register_train(CLI::App& app) {
  struct Args {
    std::string config, metrics, save, resume;
    std::vector<std::string> sets;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("train", "train a model from a YAML config");
  cmd->add_option("config", a->config, "training config (YAML)")->required();
  cmd->add_option("--set", a->sets, "override a config value, e.g. --set train.lr=3e-4 (repeatable)");
  cmd->add_option("--metrics", a->metrics, "write one JSON line of metrics per step to this file");
  cmd->add_option("--save", a->save, "write checkpoints to DIR/step-NNNNNN/");
  cmd->add_option("--resume", a->resume, "resume from a step folder, or the newest one under DIR");
  return {{cmd, [a] {
             RunConfig cfg = load_or_bad_input(a->config, a->sets);
             TrainResult r = train(cfg, TrainOptions{.metrics_path = a->metrics, .save_dir = a->save, .resume_dir = a->resume});
             if (!r.steps.empty())
               log_info("done: {} steps in {:.1f}s, final loss {:.4f}", r.steps.size(), r.seconds, r.steps.back().loss);
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
  cmd->add_option("--steps", a->opts.steps, "measured steps (median reported)")->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", a->opts.warmup, "unmeasured warm-up steps")->check(CLI::NonNegativeNumber);
  cmd->add_option("--threads", a->threads, "intra-op and BLAS threads (default: the config's, else all)");
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
