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
  r.software = "megatron-2021";
  r.source = "Narayanan et al. 2021, Table 1";
  return r;
}

// A row of the Megatron-LM README's weak-scaling table: the model (heads, hidden, layers are
// its preset), tp, pp, dp, the GPU count (tp·pp·dp), the global batch, per-GPU teraFLOP/s and
// MFU as printed. Assumptions where the README is silent, each the reading that fits what it
// does say:
//  - sequence parallelism wherever tp > 1: the runs overlap tensor-parallel communication
//    (--tp-comm-overlap), which Megatron-Core only does with --sequence-parallel;
//  - ZeRO stage 1: --overlap-param-gather needs Megatron's distributed optimizer (optimizer
//    states sharded over dp, gradients reduce-scattered, parameters all-gathered);
//  - no activation recomputation (Megatron's default; the README names none) and
//    micro-batch size 1;
//  - the plain 1F1B schedule where pipelined: no --num-layers-per-virtual-pipeline-stage is
//    named, and the 119B row's 23 layers per stage would only interleave one layer a chunk;
//  - bf16: MFU is the TFLOP/s over H100's dense bf16 peak of 989 TFLOP/s (408.8 / 989 = 41%,
//    459.9 / 989 = 47%, as printed).
// The TFLOP/s count model FLOPs: they are MFU x 989, so recomputation, if any, is not in them.
PublishedRun mcore_row(const char* model, int tp, int pp, int dp, int64_t batch, double tflops, double mfu) {
  PublishedRun r;
  r.model = model;
  r.cluster = "dgx-h100:" + std::to_string(tp * pp * dp);
  r.dtype = "bf16";
  r.global_batch = batch;
  r.layout.tp = tp;
  r.layout.pp = pp;
  r.layout.dp = dp;
  r.layout.sp = tp > 1;
  r.layout.sharding_stage = 1;
  r.layout.micro_batch = 1;
  r.layout.micro_batches = batch / dp;
  r.layout.recompute = "none";
  r.layout.schedule = "1F1B";
  r.tflops_per_device = tflops;
  r.model_flops = true;
  r.mfu = mfu;
  r.software = "megatron-core-r0.8";
  r.source = "Megatron-LM README (Megatron-Core r0.8), H100 weak scaling";
  return r;
}

// A row of MT-NLG's system performance (Smith et al. 2022, §2.4): DGX A100 nodes, tp 8 inside
// a node, pp 35 across nodes, dp the rest, batch 1920 of 2048 tokens; the iteration time and
// the TFLOP/s per GPU as printed. The TFLOP/s are hardware FLOPs with full recomputation: the
// 530B model's 96·B·s·l·h²(1 + s/6h + V/16lh) = 1.69e19 FLOPs per step over 60.1 s on 2240
// GPUs is 125.7 TFLOP/s, the 126 printed (120.4 and 113.5 for the other two rows). Assumptions
// where the paper is silent: micro-batch size 1; DeepSpeed's pipeline engine schedule, which
// is 1F1B without interleaving; full recomputation (the TFLOP/s above count it); plain data
// parallelism (ZeRO stage 0: the paper names tensor, pipeline and data parallelism only);
// bf16.
PublishedRun mtnlg_row(int nodes, double seconds, double tflops) {
  PublishedRun r;
  r.model = "mt-nlg-530b";
  r.cluster = "dgx-a100-80g:" + std::to_string(nodes * 8);
  r.dtype = "bf16";
  r.global_batch = 1920;
  r.layout.tp = 8;
  r.layout.pp = 35;
  r.layout.dp = nodes * 8 / (8 * 35);
  r.layout.micro_batch = 1;
  r.layout.micro_batches = r.global_batch / r.layout.dp;
  r.layout.recompute = "full";
  r.layout.schedule = "1F1B";
  r.tflops_per_device = tflops;
  r.iteration_time = seconds;
  r.software = "deepspeed-megatron-2022";
  r.source = "Smith et al. 2022, section 2.4";
  return r;
}

// Source: github.com/bigscience-workshop/bigscience (commit 9e64ede), train/tr11-176B-ml: the
// training script tr11-176B-ml.slurm (TP_SIZE=4, PP_SIZE=12, GLOBAL_BATCH_SIZE=2048 with
// MICRO_BATCH_SIZE=2, "was MBS=1 till GBS=784", --bf16, --checkpoint-activations, ZeRO stage 0
// with DeepSpeed's bf16 optimizer, which "implements its own zero stage 1 equivalent") on 48
// nodes of Jean Zay (384 GPUs; DP = 384 / (4 x 12) = 8), and its README's figures:
//  - iteration 85376, the end of the first epoch: "elapsed time per iteration (s): 104.70 ...
//    global batch size: 2048 ... TFLOPs: 149.77";
//  - iteration 3707 of a run starting the batch ramp at 16 ("measured on our setup", GBS=16 with
//    MBS=2: one micro-batch per replica and step): "elapsed time per iteration (s): 15.23 ...
//    global batch size: 16 ... TFLOPs: 8.04";
//  - the final run's start, "GBS=192/MBS=1 @ 73 TFLOPs" (a rounded figure, no time given).
// The TFLOP/s are hardware FLOPs with recomputation (the README: "it's the hardware TFLOPs that
// we calculate - using the 4*2 co-efficient"), the same 96·B·s·l·h²(1 + s/6h + V/16lh).
// Assumptions where the sources are silent: the 1F1B schedule of DeepSpeed's pipeline engine, as
// for MT-NLG; ZeRO stage 1 for the bf16 optimizer's sharded states (it all-reduces the gradients
// in bf16 and all-gathers the parameters, one more gather's worth of traffic than tessel's ZeRO 1
// charges: about 1% of the big batch's step). The first two rows are the calibration of the
// deepspeed-megatron-2022 profile (its kernel_efficiency and step_overhead are the one pair that
// predicts both: software.cc), so they are in-sample; the third is a check the fit did not see,
// and MT-NLG is then predicted with nothing fitted to it.
PublishedRun bloom_row(int64_t batch, int64_t micro_batch, double seconds, double tflops, const char* source,
                       int nodes = 48, int tp = 4, int pp = 12) {
  PublishedRun r;
  r.model = "bloom-176b";
  r.cluster = "jean-zay-a100:" + std::to_string(nodes * 8);
  r.dtype = "bf16";
  r.global_batch = batch;
  r.layout.tp = tp;
  r.layout.pp = pp;
  r.layout.dp = nodes * 8 / (tp * pp);
  r.layout.sharding_stage = 1;
  r.layout.micro_batch = micro_batch;
  r.layout.micro_batches = batch / (r.layout.dp * micro_batch);
  r.layout.recompute = "full";
  r.layout.schedule = "1F1B";
  r.tflops_per_device = tflops;
  r.iteration_time = seconds;
  r.software = "deepspeed-megatron-2022";
  r.source = source;
  return r;
}

}  // namespace

// Source: the same repository, train/tr11-176B-ml/reshaping-log.md ("Checkpoint reshaping
// experiments"): BLOOM resumed from global_step94767 with other layouts on 24 and 36 nodes, batch
// 2048, each logging its first iterations. Taken: the last logged iteration of each layout (the
// first after a resume ran up to 41% slower than the next in that log); left out: TP=4/PP=12/MBS=1
// on 24 nodes (only its first iteration is logged) and TP=1/PP=72 (BLOOM's partition counts its two
// embeddings as pipeline units, 72 units for 72 stages; tessel's needs a layer in every stage).
// Nothing is fitted to these rows.
std::vector<PublishedRun> bigscience_bloom_reshaping() {
  const char* log = "BigScience tr11-176B-ml reshaping-log.md";
  return {bloom_row(2048, 2, 215.99, 145.19, log, 24, 4, 12), bloom_row(2048, 1, 220.30, 142.35, log, 24, 4, 24),
          bloom_row(2048, 1, 199.82, 156.95, log, 24, 2, 24), bloom_row(2048, 1, 155.71, 134.26, log, 36, 4, 36),
          bloom_row(2048, 1, 141.22, 148.04, log, 36, 2, 36)};
}

std::vector<PublishedRun> bigscience_bloom() {
  return {bloom_row(2048, 2, 104.70, 149.77, "BigScience tr11-176B-ml README, iteration 85376"),
          bloom_row(16, 2, 15.23, 8.04, "BigScience tr11-176B-ml README, iteration 3707 at GBS=16"),
          bloom_row(192, 1, 0, 73, "BigScience tr11-176B-ml README, GBS=192/MBS=1 @ 73 TFLOPs")};
}

// Source: github.com/NVIDIA/Megatron-LM, megatron/core/transformer/moe/README.md at tag
// core_v0.9.0 (commit 1afee592e85ac7994887eb5f4ef3998f76384333): its first paragraph, "This
// boosts Mixtral 8X7B bf16 training to achieve 438 TFLOPS as of MCore v0.8", and its section
// "Reference Best Parallel Mapping", "the reference parallel mappings of MCore v0.8 for Mixtral
// 8x7B and 8x22B": Mixtral 8x7B (Dropless), vocabulary 32K, All-to-All dispatcher, BF16, 64
// GPUs, sequence 4096, TP 1, EP 8, PP 4, VP 8, MBS 1, GBS 256, on "8xH100 80GB HBM3, NVLink 4th
// Generation, InfiniBand 8x400 Gbit/s" servers (PyTorch 24.04, Transformer Engine v1.9). (At
// core_v0.10.0 the same README says 468 TFLOPS "as of MCore v0.9" with the same mapping.)
// Assumptions where the README is silent, each the reading that fits what it does say:
//  - the 438 TFLOP/s were measured with that mapping: the README gives no other Mixtral 8x7B
//    setting, and both are "of MCore v0.8";
//  - per GPU, in Megatron's count (training.py num_floating_point_operations at the tag: model
//    FLOPs of the top-k experts a token passes through, no recomputation), which step_flops
//    reproduces;
//  - ZeRO stage 1 (the README's MoE example and its quick start use
//    --use-distributed-optimizer, with --overlap-grad-reduce and --overlap-param-gather), no
//    activation recomputation (none named), sequence parallel (named by the example; a no-op at
//    TP 1), the interleaved schedule (VP 8: one layer per chunk);
//  - dropless routing with a trained router's even load (the README warns that the first few
//    hundred steps of a dropless run are imbalanced and measures after them).
// DP is what is left: 64 / (TP 1 x EP 8 x PP 4) = 2, the batch split over DP x EP = 16 ranks.
std::vector<PublishedRun> megatron_core_mixtral() {
  PublishedRun r;
  r.model = "mixtral-8x7b";
  r.cluster = "dgx-h100:64";
  r.dtype = "bf16";
  r.global_batch = 256;
  r.layout.tp = 1;
  r.layout.ep = 8;
  r.layout.pp = 4;
  r.layout.vpp = 8;
  r.layout.dp = 64 / (1 * 8 * 4);
  r.layout.sp = false;  // tp 1
  r.layout.sharding_stage = 1;
  r.layout.micro_batch = 1;
  r.layout.micro_batches = r.global_batch / (r.layout.dp * r.layout.ep);
  r.layout.recompute = "none";
  r.layout.schedule = "VPP";
  r.tflops_per_device = 438;
  r.model_flops = true;
  r.software = "megatron-core-r0.8";
  r.source = "Megatron-LM megatron/core/transformer/moe/README.md at core_v0.9.0 (MCore v0.8)";
  return {r};
}

std::vector<PublishedRun> narayanan2021_table1() {
  return {
      row("gpt-1.7b", 32, 1, 1, 512, 137),    row("gpt-3.6b", 64, 2, 1, 512, 138),
      row("gpt-7.5b", 128, 4, 1, 512, 142),   row("gpt-18b", 256, 8, 1, 1024, 135),
      row("gpt-39b", 512, 8, 2, 1536, 138),   row("gpt-76b", 1024, 8, 4, 1792, 140),
      row("gpt-146b", 1536, 8, 8, 2304, 148), row("gpt-310b", 1920, 8, 16, 2160, 155),
      row("gpt-530b", 2520, 8, 35, 2520, 163), row("gpt-1t", 3072, 8, 64, 3072, 163),
  };
}

// Source: github.com/NVIDIA/Megatron-LM, README.md, section "Training Speed and Scalability",
// at tag core_v0.8.0 (commit baf94af3c667248865f23df73b9fb8e2395e6fd0, 2024-08-12). The table
// is the image images/model_table.png the section shows (added in commit
// f2e5db402c44ae309aa6448bcb4ae87e8ae0f5f4, "New scaling figures on H100 GPUs", 2024-07-15;
// the same file at the tag), columns: Model size, Attention heads, Hidden size, Number of
// layers, Tensor MP size, Pipeline MP size, Data-parallel size, Number of GPUs, Batch size,
// Per-GPU teraFLOP/s, MFU, Aggregate petaFLOP/s. The text: "All models use a vocabulary size
// of 131,072 and a sequence length of 4096". Read off the image and cross-checked: tp·pp·dp is
// the GPU count and TFLOP/s x GPUs the aggregate column on every row.
std::vector<PublishedRun> megatron_core_r08_weak_scaling() {
  return {
      mcore_row("mcore-gpt-1.7b", 1, 1, 48, 192, 408.8, 0.41),
      mcore_row("mcore-gpt-7.1b", 2, 1, 48, 192, 465.9, 0.47),
      mcore_row("mcore-gpt-16b", 4, 1, 48, 192, 489.1, 0.49),
      mcore_row("mcore-gpt-32b", 8, 1, 48, 192, 459.6, 0.46),
      mcore_row("mcore-gpt-70b", 8, 2, 48, 384, 419.7, 0.42),
      mcore_row("mcore-gpt-119b", 8, 4, 48, 768, 420.5, 0.43),
      mcore_row("mcore-gpt-177b", 8, 6, 48, 1152, 432.8, 0.44),
      mcore_row("mcore-gpt-314b", 8, 8, 48, 1536, 474.4, 0.48),
      mcore_row("mcore-gpt-462b", 8, 16, 48, 3072, 459.9, 0.47),
  };
}

// Source: Smith et al. 2022, arXiv:2201.11990, §2.4 (system performance evaluation): the 530B
// model at global batch 1920 on 280, 350 and 420 DGX A100 servers, iteration times 60.1, 50.2
// and 44.4 s, which the paper says correspond to 126, 121 and 113 teraFLOP/s per GPU. The
// paper's own text was not reachable from this workspace: the figures are as two independent
// secondary sources quote §2.4 (github.com/cli99/llm-analysis,
// examples/megatron-turing-nlg/README.md; and a hand-read dataset of held-out runs citing the
// PDF's p7), which agree on every number, and they are consistent with the model's FLOP count
// (see mtnlg_row). GPU memory: 80 GB A100s, as that dataset reads §2.3 and as the Microsoft
// Research blog post announcing MT-NLG (2021-10-11) describes Selene's DGX A100 nodes;
// llm-analysis assumes 40 GB parts, the one source saying so. The layout, tp 8 and pp 35 with
// dp the rest (8, 10, 12), is as issue 28 and llm-analysis's run_train.sh give it.
std::vector<PublishedRun> smith2022_mtnlg() {
  return {mtnlg_row(280, 60.1, 126), mtnlg_row(350, 50.2, 121), mtnlg_row(420, 44.4, 113)};
}

Cluster published_cluster(const PublishedRun& r) {
  Cluster c = cluster_preset(r.cluster);
  c.dtype = r.dtype;
  c.software = software_profile(r.software);
  return c;
}

std::vector<PublishedTable> published_tables() {
  return {
      {"narayanan2021-table1", "Narayanan et al. 2021, Table 1 (arXiv:2104.04473)", narayanan2021_table1(),
       "the A100 device calibration (gemm_efficiency) with the megatron-2021 profile"},
      {"megatron-core-r0.8-h100", "Megatron-LM README.md at core_v0.8.0 (baf94af3c667), Training Speed and Scalability",
       megatron_core_r08_weak_scaling()},
      {"mt-nlg-530b", "Smith et al. 2022, section 2.4 (arXiv:2201.11990)", smith2022_mtnlg()},
      {"bigscience-bloom-176b",
       "github.com/bigscience-workshop/bigscience train/tr11-176B-ml (9e64ede): README.md, iterations 85376 and 3707, "
       "GBS=192/MBS=1",
       bigscience_bloom(),
       "the deepspeed-megatron-2022 profile's kernel_efficiency and step_overhead (rows 1 and 2; row 3 is a check)"},
      {"bigscience-bloom-176b-reshaping",
       "github.com/bigscience-workshop/bigscience train/tr11-176B-ml (9e64ede): reshaping-log.md, the last logged "
       "iteration of each layout",
       bigscience_bloom_reshaping()},
      {"megatron-core-mixtral-h100",
       "Megatron-LM megatron/core/transformer/moe/README.md at core_v0.9.0 (1afee592e85a): 438 TFLOPS as of MCore "
       "v0.8, Reference Best Parallel Mapping",
       megatron_core_mixtral()},
  };
}

}  // namespace tessel::plan
