// Published large-scale training runs the cost model is checked against. Each function returns
// one table as its source prints it, with the layout fields the source is silent on filled by
// stated assumptions. Two tables set a calibration and are in-sample: Narayanan et al. 2021
// Table 1 the A100 preset's, two of BLOOM's runs the deepspeed-megatron-2022 profile's; the
// others are out-of-sample: nothing is fitted to them.
#pragma once

#include <string>
#include <vector>

#include "tessel/plan/planner.h"

namespace tessel::plan {

struct PublishedRun {
  std::string model;       // model preset
  std::string cluster;     // cluster preset with its device count
  std::string dtype = "bf16";  // the dtype the run computed in (selects the cluster's peak)
  std::string software;        // the software profile of the stack it ran (software.h)
  int64_t global_batch = 0;
  Layout layout;           // as published (micro-batches follow from the batch)
  // Achieved TFLOP/s per GPU as reported. model_flops: the source counts model FLOPs (no
  // recomputation; MFU x peak), else hardware FLOPs with the recomputation the layout does
  // (Narayanan et al.'s 96·B·s·l·h²(1 + s/6h + V/16lh) with full recompute).
  double tflops_per_device = 0;
  bool model_flops = false;
  double mfu = 0;             // reported model FLOPs utilisation; 0 where the source gives none
  double iteration_time = 0;  // reported seconds per step; 0 where the source gives none
  std::string source;
};

// Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
// Megatron-LM", Table 1: GPT 1.7B to 1T on A100-80GB (DGX A100 nodes), full activation
// recomputation, the interleaved schedule where pipelined. The paper gives tp, pp, the GPU count
// and the batch; micro-batch size 1 and the chunk count per rank (vpp: the smallest divisor > 1
// of the layers per stage) are our assumptions where the table is silent.
std::vector<PublishedRun> narayanan2021_table1();

// The Megatron-LM README's H100 weak-scaling table (Megatron-Core r0.8: GPT 1.7B to 462B on
// 48 to 6144 H100 GPUs, seq 4096, vocab 131,072, bf16), reported as model TFLOP/s per GPU and
// MFU. See published.cc for the exact source and the assumptions.
std::vector<PublishedRun> megatron_core_r08_weak_scaling();

// Smith et al. 2022, "Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B", §2.4:
// iteration times of the 530B model at batch 1920 on 280, 350 and 420 DGX A100 nodes (2240,
// 2800, 3360 GPUs; tp 8, pp 35), with the hardware TFLOP/s per GPU they correspond to.
std::vector<PublishedRun> smith2022_mtnlg();

// BigScience's BLOOM 176B on 384 A100-80GB of Jean Zay (tp 4, pp 12, dp 8, 2048 tokens, bf16,
// full recompute; Megatron-DeepSpeed), as its training README logs it: 104.70 s per iteration
// at batch 2048 (micro-batch 2), 15.23 s at batch 16 (one micro-batch per replica), and 73
// TFLOP/s at batch 192 (micro-batch 1). The first two rows calibrate the
// deepspeed-megatron-2022 profile (software.cc); the third checks it.
std::vector<PublishedRun> bigscience_bloom();

// BLOOM 176B on 24 and 36 nodes of Jean Zay with five other layouts (tp 2-4, pp 12-36, batch
// 2048), from its checkpoint-reshaping log: out-of-sample checks of the same profile.
std::vector<PublishedRun> bigscience_bloom_reshaping();

// Megatron-Core's Mixtral 8x7B on 64 H100 GPUs (MCore v0.8: TP 1, EP 8, PP 4, VP 8, batch 256
// of 4096 tokens, dropless, bf16), 438 model TFLOP/s per GPU, as its MoE README states. See
// published.cc for the exact source and the assumptions.
std::vector<PublishedRun> megatron_core_mixtral();

// The cluster a row ran on: its preset with the row's dtype and software profile.
Cluster published_cluster(const PublishedRun& r);

// Every table above by name, in the order the docs list them.
struct PublishedTable {
  std::string name;
  std::string source;
  std::vector<PublishedRun> rows;
  std::string calibrates;  // what the table sets (in-sample); empty: out-of-sample, nothing fitted to it
};
std::vector<PublishedTable> published_tables();

}  // namespace tessel::plan
