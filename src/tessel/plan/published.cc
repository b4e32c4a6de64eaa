#include "tessel/plan/published.h"

#include "tessel/plan/model_spec.h"

namespace tessel::plan {

namespace {

PublishedRun row(const char* model, int gpus, int tp, int pp, int64_t batch, double tflops) {
  PublishedRun r;
  r.model = model;
  r.cluster = "dgx-a100-80g:" + std::to_string(gpus);
  r.global_batch = batch;
  r.layout.tp = tp;
  r.layout.pp = pp;
  r.layout.dp = gpus / (tp * pp);
  r.layout.micro_batch = 1;
  r.layout.recompute = "full";
  const int64_t per_stage = model_preset(model).layers / pp;
  int vpp = 1;
  if (pp > 1)
    for (int v = 2; v <= per_stage; ++v)
      if (per_stage % v == 0) {
        vpp = v;
        break;
      }
  r.layout.vpp = vpp;
  r.layout.schedule = vpp > 1 ? "VPP" : "1F1B";
  r.layout.micro_batches = batch / r.layout.dp;
  r.tflops_per_device = tflops;
  r.source = "Narayanan et al. 2021, Table 1";
  return r;
}

}  // namespace

std::vector<PublishedRun> narayanan2021_table1() {
  return {
      row("gpt-1.7b", 32, 1, 1, 512, 137),    row("gpt-3.6b", 64, 2, 1, 512, 138),
      row("gpt-7.5b", 128, 4, 1, 512, 142),   row("gpt-18b", 256, 8, 1, 1024, 135),
      row("gpt-39b", 512, 8, 2, 1536, 138),   row("gpt-76b", 1024, 8, 4, 1792, 140),
      row("gpt-146b", 1536, 8, 8, 2304, 148), row("gpt-310b", 1920, 8, 16, 2160, 155),
      row("gpt-530b", 2520, 8, 35, 2520, 163), row("gpt-1t", 3072, 8, 64, 3072, 163),
  };
}

}  // namespace tessel::plan
