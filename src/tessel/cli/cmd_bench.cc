// `tessel bench ...`: performance measured beside a reference from the same run.
#include "tessel/cli/bench_comm.h"
#include "tessel/cli/commands.h"
#include "tessel/core/error.h"

namespace tessel {

std::vector<Command> register_bench_train(CLI::App& bench);  // cmd_train.cc

std::vector<Command> register_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "measure performance beside a reference from the same run");
  bench->require_subcommand(1);
  std::vector<Command> out = register_bench_train(*bench);

  auto o = std::make_shared<CommBenchOptions>();
  CLI::App* comm = bench->add_subcommand(
      "comm", "collective timings like nccl-tests (size, time, algbw, busbw) beside memcpy bandwidth; under `tessel "
              "launch` it runs on the gloo backend across the launched processes");
  comm->add_option("--backend", o->backend, "thread or gloo (without tessel launch gloo ranks are threads)")
      ->check(CLI::IsMember({"thread", "gloo"}));
  comm->add_option("--np", o->np, "number of ranks (ignored under tessel launch)")->check(kPositiveCount);
  comm->add_option("--op", o->op, "all_reduce, all_gather, reduce_scatter, all_to_all, broadcast or send_recv")
      ->check(CLI::IsMember({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"}));
  comm->add_option("--min", o->min_bytes, "smallest size in bytes (doubling up to --max)")->check(kPositiveCount);
  comm->add_option("--max", o->max_bytes, "largest size in bytes")->check(kPositiveCount);
  comm->add_option("--ranks-per-node", o->ranks_per_node,
                   "emulate nodes of this many ranks (thread ranks, or gloo ranks as threads; under tessel launch the "
                   "nodes are the launcher's). With several nodes all_to_all prints the hierarchical form beside the flat")
      ->check(kNonNegativeCount);
  comm->add_option("--iters", o->iterations, "iterations per size (default or 0: enough for 0.2 s)")
      ->check(kNonNegativeCount);
  out.push_back({comm, [o] {
                   if (o->min_bytes < 4 || o->min_bytes > o->max_bytes)
                     throw BadInput(fmt::format("--min {} and --max {}: need 4 <= min <= max", o->min_bytes, o->max_bytes));
                   return run_comm_bench(*o);
                 }});
  return out;
}

}  // namespace tessel
