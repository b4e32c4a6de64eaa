// Pipeline bubbles measured from the runtime's own timestamps beside the theory: for each
// schedule, 2 pipeline ranks (threads, 1 intra-op thread each) train a GPT-2 whose stages are
// balanced, and each rank's idle share — 1 − (time in F, B, W) / (step time) — is taken per
// step; the median over steps (after warm-up) and ranks is printed next to (p−1)/(m+p−1) for
// 1F1B and FThenB and (p−1)/(v·m+p−1) for the interleaved schedule. ZB-H1 has no closed form;
// its unit-time simulation is printed, and it should come out below 1F1B.
//
//   build/release/bench/pipeline_bench [--microbatches 8] [--steps 8]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "bench_util.h"
#include "tessel/cli/config.h"
#include "tessel/engine/engine.h"
#include "tessel/parallel/schedule.h"

using namespace tessel;

namespace {

using tessel::bench::median;

}  // namespace

int main(int argc, char** argv) {
  int m = 8, steps = 8;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--microbatches") == 0 && i + 1 < argc) m = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = std::atoi(argv[++i]);
    else {
      std::printf("usage: pipeline_bench [--microbatches M] [--steps N]\n"
                  "Idle share per pipeline schedule, measured vs theory (2 pipeline ranks).\n");
      return std::strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  const int p = 2, warmup = 2;
  std::printf("pipeline idle share, p=%d ranks, m=%d micro-batches, GPT-2 8 blocks x 256 wide, seq 32; median of %d "
              "steps x %d ranks\n", p, m, steps - warmup, p);
  std::printf("%-8s %4s %10s %10s %12s\n", "schedule", "v", "measured", "theory", "difference");
  for (const char* kind : {"FThenB", "1F1B", "VPP", "ZBH1"}) {
    const int v = std::strcmp(kind, "VPP") == 0 ? 2 : 1;
    RunConfig cfg = load_run_config(std::string(TESSEL_SOURCE_DIR) + "/configs/gpt2-tiny.yaml",
                                    {"model.n_layer=8", "model.n_embd=256", "model.n_head=4", "train.seq_len=32",
                                     fmt::format("train.global_batch={}", 2 * m), fmt::format("train.micro_batch={}", 2),
                                     fmt::format("train.steps={}", steps), "train.warmup=0", "train.save_every=0",
                                     "train.threads=1", "train.dropout=0"});
    cfg.parallel.pp = p;
    cfg.parallel.vpp = v;
    cfg.parallel.schedule = kind;
    ParallelTrainResult r = train_parallel_threads(cfg, p, ParallelTrainOptions{.base = TrainOptions{.quiet = true}});
    std::vector<double> shares;
    for (const auto& per_rank : r.rank_idle_shares)
      for (size_t s = warmup; s < per_rank.size(); ++s) shares.push_back(per_rank[s]);
    const double measured = median(shares);
    std::string per_rank;
    for (size_t k = 0; k < r.rank_idle_shares.size(); ++k) {
      std::vector<double> v(r.rank_idle_shares[k].begin() + std::min<size_t>(warmup, r.rank_idle_shares[k].size()),
                            r.rank_idle_shares[k].end());
      per_rank += fmt::format("{}rank {} {:.1f}%", k ? ", " : "", k, 100 * median(v));
    }
    const double theory = parallel::theoretical_idle_share(parallel::make_schedule(kind, p, m, v));
    std::printf("%-8s %4d %9.1f%% %9.1f%% %+10.1f pts%s\n", kind, v, 100 * measured, 100 * theory,
                100 * (measured - theory), std::strcmp(kind, "ZBH1") == 0 ? "  (theory: unit-time simulation)" : "");
    std::printf("         per rank: %s\n", per_rank.c_str());
    std::fflush(stdout);
  }
}
