// The tessel command line: train, bench.
//
// Exit status: 0 on success, 2 for bad input (unknown flag, bad config, missing file),
// 1 when a run fails after it started.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "tessel/cli/bench_train.h"
#include "tessel/cli/trainer.h"
#include "tessel/core/context.h"
#include "tessel/core/log.h"

using namespace tessel;

namespace {

// Distinguishes errors in what the user gave (exit 2) from failures of a run (exit 1).
struct BadInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};

RunConfig load_config_or_fail(const std::string& path, const std::vector<std::string>& sets) {
  try {
    return load_run_config(path, sets);
  } catch (const Error& e) {
    throw BadInput(e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessel: train large networks across many devices from a program written for one"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tessel 0.1.0");

  // ---- train ----
  CLI::App* train_cmd = app.add_subcommand("train", "train a model from a YAML config");
  std::string config_path, metrics_path, save_dir, resume_dir;
  std::vector<std::string> sets;
  train_cmd->add_option("config", config_path, "training config (YAML)")->required();
  train_cmd->add_option("--set", sets, "override a config value, e.g. --set train.lr=3e-4 (repeatable)");
  train_cmd->add_option("--metrics", metrics_path, "write one JSON line of metrics per step to this file");
  train_cmd->add_option("--save", save_dir, "write checkpoints to DIR/step-NNNNNN/");
  train_cmd->add_option("--resume", resume_dir, "resume from a step folder, or the newest one under DIR");

  // ---- bench ----
  CLI::App* bench_cmd = app.add_subcommand("bench", "measure performance beside a reference from the same run");
  bench_cmd->require_subcommand(1);
  CLI::App* bench_train_cmd = bench_cmd->add_subcommand("train", "training tokens/s and model FLOP/s vs. the sgemm peak");
  std::string bench_config;
  std::vector<std::string> bench_sets;
  TrainBenchOptions bench_opts;
  int bench_threads = 0;
  bool bench_json = false;
  bench_train_cmd->add_option("config", bench_config, "training config (YAML)")->required();
  bench_train_cmd->add_option("--set", bench_sets, "override a config value (repeatable)");
  bench_train_cmd->add_option("--steps", bench_opts.steps, "measured steps (median reported)")->check(CLI::PositiveNumber);
  bench_train_cmd->add_option("--warmup", bench_opts.warmup, "unmeasured warm-up steps")->check(CLI::NonNegativeNumber);
  bench_train_cmd->add_option("--threads", bench_threads, "intra-op and BLAS threads (default: the config's, else all)");
  bench_train_cmd->add_flag("--json", bench_json, "print one JSON object instead of a table");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);  // prints help or the parse error
    return code == 0 ? 0 : 2;
  }

  try {
    if (*train_cmd) {
      RunConfig cfg = load_config_or_fail(config_path, sets);
      TrainResult r = train(cfg, TrainOptions{.metrics_path = metrics_path, .save_dir = save_dir, .resume_dir = resume_dir});
      if (!r.steps.empty())
        log_info("done: {} steps in {:.1f}s, final loss {:.4f}", r.steps.size(), r.seconds, r.steps.back().loss);
    } else if (*bench_train_cmd) {
      RunConfig cfg = load_config_or_fail(bench_config, bench_sets);
      if (bench_threads > 0) cfg.train.threads = bench_threads;
      Json j = bench_train(cfg, bench_opts);
      if (bench_json) {
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("tessel bench train %s (%s, %.2fM parameters, %lld threads)\n", bench_config.c_str(),
                    j.at("arch").as_string().c_str(), static_cast<double>(j.at("parameters").as_int()) / 1e6,
                    static_cast<long long>(j.at("threads").as_int()));
        std::printf("  step time (median of %lld)   %.4f s\n", static_cast<long long>(bench_opts.steps),
                    j.at("step_time_s").as_double());
        std::printf("  tokens/s                    %.0f\n", j.at("tokens_per_s").as_double());
        std::printf("  model FLOP/s                %.2f GFLOP/s  (6·N + attention per token)\n",
                    j.at("model_flops_per_s").as_double() / 1e9);
        std::printf("  sgemm peak, same threads    %.2f GFLOP/s  (measured in this run)\n",
                    j.at("sgemm_peak_flops_per_s").as_double() / 1e9);
        std::printf("  share of sgemm peak         %.1f%%\n", 100 * j.at("share_of_sgemm_peak").as_double());
      }
    }
  } catch (const BadInput& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
