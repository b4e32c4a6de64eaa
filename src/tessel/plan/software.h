// Software profiles: how a training stack runs on a device, apart from what the device is.
//
// A device preset (cluster.h) says what the hardware and its vendor libraries reach in
// isolation: peak FLOP/s, memory, bandwidths, and the calibration of a lone GEMM, a streaming
// kernel and a collective's bus bandwidth. A software profile says what the stack training on
// it does with that: whether attention runs fused and how fast relative to a GEMM, what share
// of the lone-kernel rates its kernels reach inside a training step, which communication it
// overlaps with compute, its per-kernel overhead and what its allocator and libraries hold.
// One profile per stack, never per model or per row; every value names its source in `sources`.
//
// Named profiles: megatron-2021 (Narayanan et al. 2021 on A100), megatron-core-r0.8
// (the Megatron-LM README's H100 runs), deepspeed-megatron-2022 (Megatron-DeepSpeed: BLOOM 176B,
// which calibrates it, and MT-NLG 530B), tessel-cpu
// (tessel on CPU thread ranks; `tessel cluster detect` measures its numbers).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace tessel::plan {

// Which communication the stack overlaps with compute (docs/plan.md, "Overlap"):
//  - tp_comm: tensor-parallel all-gathers / reduce-scatters run in chunks under the GEMM they
//    feed or follow (Megatron-Core --tp-comm-overlap, Transformer Engine userbuffers); exposed
//    is what the GEMM cannot cover plus the first chunk.
//  - grad_reduce: the data-parallel gradient reduction goes bucket by bucket while the backward
//    of the step's last micro-batch runs (--overlap-grad-reduce); exposed is what that backward
//    cannot cover plus the last bucket.
//  - param_gather: ZeRO's parameter all-gather runs under the first micro-batch's forward of the
//    next step (--overlap-param-gather); exposed is what that forward cannot cover.
//  - p2p: pipeline sends run beside compute (non-blocking); false: a stage waits for its own
//    sends, which then add to its forward and backward (blocking send/recv).
struct Overlap {
  bool tp_comm = false;
  bool grad_reduce = false;
  bool param_gather = false;
  bool p2p = true;
};

struct SoftwareProfile {
  std::string name = "default";
  bool fused_attention = true;       // attention in one kernel (FlashAttention; tessel's CPU sdpa);
                                     // false: scores materialised (Megatron-LM 2021)
  double attention_efficiency = 1;   // a fused attention kernel's rate as a share of a GEMM's of
                                     // its size (seq), FLOPs counted over the whole s x s: up to
                                     // 2, since a causal kernel skips the masked half (up to 4
                                     // with attention_half_dim, the share as the query length grows)
  double attention_half_dim = 0;     // the fused kernel's own efficiency curve over its query
                                     // length d, d / (d + half) in place of the GEMMs' (0: theirs)
  double kernel_efficiency = 1;      // share of the device's lone-GEMM rate the stack's GEMMs reach
                                     // inside a training step (clocks under load, the wgrad
                                     // accumulation into f32 main gradients, stream contention)
  double op_overhead = 0;            // seconds per kernel (launch, framework dispatch)
  double optimizer_efficiency = 1;   // share of the streaming rate (memory_bandwidth x
                                     // memory_efficiency) the optimizer step reaches on the bytes
                                     // it streams (optimizer_step_bytes)
  // The loss over the (vocab-parallel) logits as memory traffic per logit element, forward and
  // backward; 0: one softmax pass as the op registry costs it (tessel's fused cross entropy).
  double loss_fwd_bytes = 0, loss_bwd_bytes = 0;
  double step_overhead = 0;          // seconds per step outside the model's ops (the stack's own
                                     // bookkeeping: gradient-norm, loss scaling, logging syncs)
  Overlap overlap;
  double fragmentation = 0.05;       // share of device memory the allocator cannot use
  double reserved_bytes = 0;         // context, library workspaces, communication buffers
  std::map<std::string, std::string> sources;
};

// The named profiles; throws InputError naming the known ones for anything else.
SoftwareProfile software_profile(std::string_view name);
std::vector<std::string> software_profile_names();
bool is_software_profile(std::string_view name);

}  // namespace tessel::plan
