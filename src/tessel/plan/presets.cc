// Cluster presets. Device figures are datasheet values; the calibration says what the cost
// model assumes beyond them and where each value comes from. One set per device, used for
// every model — never fitted to a model or to a row of a published table.
#include <charconv>
#include <cmath>

#include "tessel/core/error.h"
#include "tessel/core/limits.h"
#include "tessel/plan/cluster.h"

namespace tessel::plan {

namespace {

// Shared by every NVIDIA preset: cuBLAS GEMMs, streaming kernels and NCCL collectives as the
// vendor's libraries run them in isolation. What a training stack reaches on top is its
// software profile (software.cc).
Calibration nvidia_calibration(double gemm_eff, std::string gemm_source, double memory_eff, std::string memory_source) {
  Calibration c;
  c.gemm_efficiency = gemm_eff;
  c.gemm_half_dim = 128;
  c.memory_efficiency = memory_eff;
  c.link_efficiency = 0.8;
  c.inter_link_efficiency = 0.94;
  c.sources = {
      {"gemm_efficiency", std::move(gemm_source)},
      {"gemm_half_dim",
       "tensor-core GEMM tiles are 128x128 (CUTLASS/cuBLAS default threadblock tile): a dim of 128 fills half a "
       "wave's worth of work; on H100 bench/gpu_kernels.py agrees: a 4096 x 7168 x 896 linear reaches 605 TFLOP/s "
       "against ~690 for its neighbours, 896 / (896 + 126)"},
      {"gemm_size", "smallest: a dim below the tile size leaves tiles and waves part empty, whatever the others"},
      {"memory_efficiency", std::move(memory_source)},
      {"link_efficiency",
       "inside a node: nccl-tests all_reduce bus bandwidth reaches about 80% of the per-GPU NVLink bandwidth "
       "at large sizes (NVIDIA DGX reference numbers: ~230 GB/s busbw on 300 GB/s NVSwitch ports; NCCL rings, "
       "without NVLink SHARP); assumed, not measured here"},
      {"inter_link_efficiency",
       "between nodes, InfiniBand NICs as NVIDIA's NCCL team gives them: \"12.2 GB/s (for a 100Gbps card) is as good "
       "as you can get\" (EDR; github.com/NVIDIA/nccl-tests issue 29, 2019) and \"For NDR @ 400Gbps you should see "
       "46-48GB/s per NIC\" (issue 290, 2025): 0.92-0.98 of line rate; 0.94 for HDR and NDR alike"},
  };
  return c;
}

Cluster dgx_a100(double memory_gb) {
  Cluster c;
  c.name = memory_gb > 60 ? "dgx-a100-80g" : "dgx-a100-40g";
  c.devices_per_node = 8;
  c.device.name = memory_gb > 60 ? "A100-SXM4-80GB" : "A100-SXM4-40GB";
  // NVIDIA A100 datasheet: 312 TFLOP/s dense bf16/f16 tensor core, 156 tf32, 19.5 f32;
  // 80 GB HBM2e at 2039 GB/s (40 GB HBM2 at 1555 GB/s). (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf,
  // www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/; rechecked for issue 28.)
  c.device.peak_flops = {{"bf16", 312e12}, {"f16", 312e12}, {"tf32", 156e12}, {"f32", 19.5e12}};
  c.device.memory_bytes = memory_gb * 1e9;
  c.device.memory_bandwidth = memory_gb > 60 ? 2.039e12 : 1.555e12;
  // Third-generation NVLink through NVSwitch: 600 GB/s per GPU, both directions together.
  c.intra = Link{"nvswitch", 300e9, 3e-6};
  // DGX A100: eight 200 Gb/s HDR InfiniBand NICs per node, one per GPU (the DGX A100 datasheet's
  // eight single-port ConnectX-6 for the compute fabric; two more serve storage). Selene, where
  // Narayanan et al. 2021 and MT-NLG (Smith et al. 2022) ran, is built of these nodes.
  c.inter = Link{"infiniband", 25e9, 8e-6};
  c.nics_per_node = 8;
  c.calibration = nvidia_calibration(
      0.8, "large bf16 GEMMs in cuBLAS reach about 250 of 312 TFLOP/s on A100 (80%), the figure "
           "commonly reported for transformer-sized GEMMs (e.g. 8192^3); set with Narayanan et al. 2021 Table 1 "
           "(in-sample there), not measured here",
      0.85, "streaming kernels (STREAM copy/triad) reach about 85% of HBM datasheet bandwidth on A100 "
            "(NVIDIA's published BabelStream-class results); assumed, not measured here");
  c.software = software_profile("megatron-2021");
  return c;
}

Cluster hopper(bool h200) {
  Cluster c;
  c.name = h200 ? "h200" : "dgx-h100";
  c.devices_per_node = 8;
  c.device.name = h200 ? "H200-SXM-141GB" : "H100-SXM5-80GB";
  // NVIDIA H100/H200 SXM datasheets: 989 TFLOP/s dense bf16 (1979 with sparsity), 494.7 tf32,
  // 67 f32; H100 80 GB HBM3 at 3.35 TB/s, H200 141 GB HBM3e at 4.8 TB/s (www.nvidia.com/en-us/
  // data-center/h100/ and /h200/, product specifications, SXM column; rechecked for issue 28:
  // the Megatron-LM README's MFU is its TFLOP/s over this 989).
  c.device.peak_flops = {{"bf16", 989e12}, {"f16", 989e12}, {"tf32", 494.7e12}, {"f32", 67e12}};
  c.device.memory_bytes = h200 ? 141e9 : 80e9;
  c.device.memory_bandwidth = h200 ? 4.8e12 : 3.35e12;
  // Fourth-generation NVLink through NVSwitch: 900 GB/s per GPU, both directions together.
  c.intra = Link{"nvswitch", 450e9, 3e-6};
  // DGX H100 / HGX H200: eight 400 Gb/s NDR NICs per node (ConnectX-7), one per GPU.
  c.inter = Link{"infiniband", 50e9, 8e-6};
  c.nics_per_node = 8;
  c.calibration = nvidia_calibration(
      0.69, "measured (bench/gpu_kernels.py, H100 80GB HBM3 SXM at 700 W, PyTorch 2.11 / CUDA 13): 8192^3 bf16 "
            "sustained for 5000 products 682 TFLOP/s (0.69 of 989; 702-730 in short bursts), and the forward + "
            "both backward GEMMs of the Megatron-Core table's linears (4096 tokens) 605-723, mean ~680",
      0.89, "measured (bench/gpu_kernels.py on an H100): a 512 MiB device copy moves 2.99 TB/s read + write, 0.89 "
            "of 3.35; tanh GELU the same, LayerNorm 1.89 (its reductions)");
  c.software = software_profile("megatron-core-r0.8");
  return c;
}

// Jean Zay's A100 partition (IDRIS), where BigScience trained BLOOM: as BLOOM's training README
// describes it (train/tr11-176B-ml/README.md in github.com/bigscience-workshop/bigscience, section
// "Hardware"): 8 A100 80GB per node "using NVLink 4 inter-gpu connects, 4 OmniPath links", the
// inter-node network Omni-Path with NCCL on a dedicated subnet. The A100 device and its
// calibration are the DGX preset's (one calibration per device), except between nodes: the
// DGX's inter_link_efficiency is InfiniBand's, so Omni-Path falls back to link_efficiency
// (below). Read from the sources: four
// 100 Gb/s Omni-Path links per node (BLOOM's NCCL log lists four hfi1 adapters,
// experiments/bandwidth/all_reduce_bench-a100-n4.txt), so a device's share between nodes is
// 4 x 12.5 / 8 = 6.25 GB/s. Assumed: inside a node, NVSwitch as in a DGX A100 — eight SXM4
// A100s sit on NVIDIA's HGX A100 8-GPU board, which joins them through NVSwitch (the 4-GPU board
// links its GPUs directly); the README's "4 inter-gpu connects" says no more. docs/plan.md gives
// what the BLOOM calibration would read with a third of that bandwidth.
Cluster jean_zay_a100() {
  Cluster c = dgx_a100(80);
  c.name = "jean-zay-a100";
  c.inter = Link{"omnipath", 6.25e9, 8e-6};
  // No figure for NCCL over Omni-Path: the device's link_efficiency (0.8, assumed) on both levels.
  c.calibration.inter_link_efficiency = 0;
  c.calibration.sources.erase("inter_link_efficiency");
  c.nics_per_node = 4;
  c.software = software_profile("deepspeed-megatron-2022");
  return c;
}

struct Preset {
  const char* name;
  Cluster (*make)();
};

const Preset kPresets[] = {
    {"dgx-a100-80g", [] { return dgx_a100(80); }},
    {"dgx-a100-40g", [] { return dgx_a100(40); }},
    {"dgx-h100", [] { return hopper(false); }},
    {"h200", [] { return hopper(true); }},
    {"jean-zay-a100", jean_zay_a100},
};

}  // namespace

std::vector<std::string> cluster_preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

bool is_cluster_preset(std::string_view spec) {
  std::string_view base = spec.substr(0, spec.find(':'));
  for (const Preset& p : kPresets)
    if (base == p.name) return true;
  return false;
}

Cluster cluster_preset(std::string_view spec) {
  std::string_view base = spec.substr(0, spec.find(':'));
  for (const Preset& p : kPresets) {
    if (base != p.name) continue;
    Cluster c = p.make();
    int64_t devices = c.devices_per_node;
    if (base.size() < spec.size()) {
      std::string_view count = spec.substr(base.size() + 1);
      auto [end, ec] = std::from_chars(count.data(), count.data() + count.size(), devices);
      TESSEL_CHECK_AS(InputError, ec == std::errc() && end == count.data() + count.size() && devices > 0,
                      "cluster '{}': expected PRESET:N with N a positive device count, got '{}'", spec, count);
      // 64-bit and bounded: 2^31 - 1 devices once wrapped in the node count below.
      TESSEL_CHECK_AS(InputError, devices <= kMaxDevices,
                      "cluster '{}': {} devices is more than {}, the most tessel plans (2^20)", spec, count,
                      kMaxDevices);
    }
    c.nodes = static_cast<int>((devices + c.devices_per_node - 1) / c.devices_per_node);
    c.total_devices = static_cast<int>(devices);
    c.name = std::string(spec);
    return c;
  }
  std::string known;
  for (const Preset& p : kPresets) known += std::string(known.empty() ? "" : ", ") + p.name;
  throw InputError(fmt::format("unknown cluster preset '{}' (known: {}, or local, or a cluster YAML file)", base, known));
}

}  // namespace tessel::plan
