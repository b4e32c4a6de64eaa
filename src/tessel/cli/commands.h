// Subcommands of the tessel binary. Each file registers its own subcommand on the app and
// returns the handler to run when that subcommand was chosen.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <stdexcept>

namespace tessel {

// Errors in what the user gave (exit status 2), as opposed to failures of a run (1).
struct BadInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Whole-number option checks whose errors read "--top: must be a positive whole number, got
// '0'" rather than CLI11's range text with its 1.8e308 bound; help shows them as POSITIVE and
// NONNEGATIVE, as CLI11's own do.
extern const CLI::Validator kPositiveCount;
extern const CLI::Validator kNonNegativeCount;

// A registered subcommand: when `cmd` was parsed, `run` returns the exit status.
struct Command {
  CLI::App* cmd = nullptr;
  std::function<int()> run;
};

std::vector<Command> register_train(CLI::App& app);   // train
std::vector<Command> register_bench(CLI::App& app);   // bench train, bench comm
std::vector<Command> register_cluster(CLI::App& app); // cluster detect
std::vector<Command> register_launch(CLI::App& app);  // launch
std::vector<Command> register_plan(CLI::App& app);    // plan
std::vector<Command> register_explain(CLI::App& app); // explain-reshard
std::vector<Command> register_ckpt(CLI::App& app);    // ckpt inspect, ckpt export

}  // namespace tessel
