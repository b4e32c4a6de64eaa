// `tessel cluster detect [--ranks N] [-o FILE] [--quiet]`: measures this machine and writes the
// `local` cluster YAML (the file `tessel plan --cluster FILE` reads).
#include <cstdio>
#include <fstream>

#include "tessel/cli/cluster_detect.h"
#include "tessel/cli/commands.h"
#include "tessel/cli/plan_support.h"
#include "tessel/core/error.h"

namespace tessel {

std::vector<Command> register_cluster(CLI::App& app) {
  CLI::App* cluster = app.add_subcommand("cluster", "describe the machines a plan runs on");
  cluster->require_subcommand(1);

  struct Args {
    int ranks = 0;
    std::string output;
    bool quiet = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* detect = cluster->add_subcommand(
      "detect",
      "measure this machine (hwloc topology, sgemm peak, memcpy bandwidth, thread-backend all_reduce, op dispatch "
      "overhead; a few seconds) and print the `local` cluster YAML, with the hardware as comments and where each "
      "figure comes from under calibration.sources and software.sources");
  detect->add_option("--ranks", a->ranks,
                     "thread ranks the plan will use on this machine: the cluster's devices_per_node, each device "
                     "getting total memory / N and its share of the cores (default: one per physical core)")
      ->check(kPositiveCount);
  detect->add_option("-o,--output", a->output, "write the YAML to FILE instead of standard output");
  detect->add_flag("-q,--quiet", a->quiet, "no progress lines on standard error");
  return {{detect, [a] {
             std::ofstream file;
             if (!a->output.empty()) {
               file.open(a->output);
               if (!file) throw BadInput(fmt::format("-o {}: cannot open for writing", a->output));
             }
             // Measured now, and kept for `tessel train --plan auto` and elastic re-plans.
             std::string yaml = local_cluster_yaml(local_cluster(a->ranks, !a->quiet, /*fresh=*/true));
             if (a->output.empty()) {
               std::fputs(yaml.c_str(), stdout);
               return 0;
             }
             file << yaml;
             file.close();
             if (!file) throw std::runtime_error(fmt::format("-o {}: writing failed", a->output));
             if (!a->quiet) std::fprintf(stderr, "cluster detect: wrote %s\n", a->output.c_str());
             return 0;
           }}};
}

}  // namespace tessel
