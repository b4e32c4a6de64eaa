// The tessel command line: train, launch, plan, bench, cluster, ckpt, explain-reshard.
//
// Exit status, one contract for every subcommand (docs/training.md, "Exit status"):
//   0    success
//   2    bad input: a flag, config, data file, checkpoint or cluster file the user must fix
//        (BadInput, and the library's InputError: CheckpointError, data-file errors, ...)
//   1    a run that failed after its input was accepted (CheckpointWriteError, CommError, ...)
//   128+N  stopped by signal N (the subcommand returns it: train and launch stop cleanly)
#include <charconv>
#include <cstdint>
#include <cstdio>

#include "tessel/cli/commands.h"
#include "tessel/core/context.h"
#include "tessel/core/error.h"
#if defined(TESSEL_HAVE_CUDA)
#include "tessel/ops/cuda/kernels.h"
#endif

using namespace tessel;

namespace {


CLI::Validator whole_number(int64_t least, const char* what, const char* name) {
  return CLI::Validator(
      [least, what](std::string& text) -> std::string {
        int64_t v = 0;
        const char* end = text.data() + text.size();
        auto [stop, ec] = std::from_chars(text.data(), end, v);
        if (ec != std::errc() || stop != end || v < least) return fmt::format("must be {}, got '{}'", what, text);
        return "";
      },
      name);
}

}  // namespace

const CLI::Validator tessel::kPositiveCount = whole_number(1, "a positive whole number", "POSITIVE");
const CLI::Validator tessel::kNonNegativeCount = whole_number(0, "a whole number, 0 or more", "NONNEGATIVE");

int main(int argc, char** argv) {
  quiet_blas_workers();
#if defined(TESSEL_HAVE_CUDA)
  cuda::install();
#endif
  CLI::App app{"tessel: train large networks across many devices from a program written for one"};
  app.require_subcommand(1);
  app.set_version_flag("--version", [] {
    return fmt::format("tessel 0.1.0 ({})\n{}", blas_kernels_description(), devices_description());
  });
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("error: {}\nRun with --help for more information.\n", e.what());
  });
  std::vector<Command> commands;
  for (auto* reg : {register_train, register_launch, register_plan, register_bench, register_cluster, register_explain, register_ckpt})
    for (Command& c : reg(app)) commands.push_back(std::move(c));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);  // prints help or the parse error
    return code == 0 ? 0 : 2;
  }
  try {
    for (Command& c : commands)
      if (c.cmd->parsed()) return c.run();
  } catch (const BadInput& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const CheckpointWriteError& e) {  // before InputError: writing failed, the input was fine
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const InputError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
