// Clusters as values: nodes of identical devices, the links inside a node and between nodes,
// and the calibration the cost model reads. A cluster has a YAML text form (parse_cluster /
// to_yaml) and named presets ("dgx-a100-80g:1024" is 1024 A100s, eight per node); `local`
// describes this machine as `tessel cluster detect` measures it.
//
// Units: FLOP/s, bytes, bytes/s and seconds throughout (YAML takes the same units; numbers may
// use exponents: 312e12).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/plan/software.h"

namespace tessel::plan {

// One level of interconnect. `bandwidth` is what one device can move through the level at once
// (its share of the node's NICs across nodes; its own port into the switch inside a node), in
// bytes/s per direction; `latency` is the alpha of one message.
struct Link {
  std::string kind;        // nvswitch, nvlink, pcie, shm, infiniband, ethernet, loopback
  double bandwidth = 0;    // bytes/s per device per direction
  double latency = 0;      // seconds
};

struct Device {
  std::string name;                          // "A100-SXM4-80GB"
  std::map<std::string, double> peak_flops;  // dense peak per dtype: bf16, f16, f32, tf32
  double memory_bytes = 0;                   // usable device memory
  double memory_bandwidth = 0;               // bytes/s
};

// What a device and its vendor libraries reach in isolation, beyond the datasheet: a lone
// GEMM's share of peak by size, a streaming kernel's share of memory bandwidth, a collective's
// share of link bandwidth. One set per device preset, never per model or stack (what a stack
// does on top is its SoftwareProfile, software.h); every value says where it comes from in
// `sources` (key -> text).
struct Calibration {
  double gemm_efficiency = 0.8;      // achieved share of peak of a large GEMM
  double gemm_half_dim = 64;         // a GEMM of size d reaches gemm_efficiency * d / (d + gemm_half_dim)
  std::string gemm_size = "smallest";  // d of an m x n x k GEMM: "smallest" (its smallest dim:
                                       // tile-bound GPU GEMMs) or "harmonic" (the harmonic mean
                                       // of m, n, k: CPU GEMMs, bound by operand traffic); see
                                       // plan::gemm_size
  double memory_efficiency = 0.8;    // achieved share of memory bandwidth of streaming kernels
  double link_efficiency = 0.8;      // achieved share of link bandwidth by a collective's busbw
  double inter_link_efficiency = 0;  // the same between nodes where a source gives it apart; 0: link_efficiency
  std::map<std::string, std::string> sources;
  // The share a collective reaches on the level between nodes (true) or inside one (false).
  double link_share(bool between_nodes) const {
    return between_nodes && inter_link_efficiency > 0 ? inter_link_efficiency : link_efficiency;
  }
};

struct Cluster {
  std::string name;            // preset name or the file it came from
  int nodes = 1;
  int devices_per_node = 1;    // the last node may hold fewer: see devices
  int total_devices = 0;       // 0: nodes * devices_per_node
  int cores_per_node = 0;      // compute slots shared by a node's devices (local thread ranks
                               // on a few cores); 0: every device has its own
  Device device;
  Link intra;                  // between devices of one node
  Link inter;                  // between nodes (per device, all NICs shared)
  int nics_per_node = 0;
  std::string dtype = "bf16";  // the dtype training computes in (selects peak_flops)
  Calibration calibration;     // the device's
  SoftwareProfile software;    // the stack's (YAML: `software: NAME` or a mapping of its keys)

  int devices() const { return total_devices > 0 ? total_devices : nodes * devices_per_node; }
  double peak() const;         // peak FLOP/s of one device in `dtype`
  // Effective share of one device's peak when devices share cores (1 otherwise).
  double compute_share(int devices_used_per_node) const;
  std::string to_yaml() const;
};

// Parses the YAML form; unknown keys, keys given twice, bad values and YAML aliases expanding
// past kMaxYamlNodes throw InputError naming the key path. Counts are bounded: nodes x
// devices_per_node at most kMaxDevices (2^20, tessel/core/limits.h). `origin` names the text in
// messages (a file path).
Cluster parse_cluster(const std::string& yaml_text, const std::string& origin);

// Presets: dgx-a100-80g, dgx-a100-40g, dgx-h100, h200 (each takes ":N" devices, 1 to
// kMaxDevices; default one node); throws InputError on anything else. A preset carries the
// software profile its device is most often planned with (A100: megatron-2021; H100/H200:
// megatron-core-r0.8); `tessel plan --software` names another. `local` is not here (it is measured: see the cli's cluster detect).
Cluster cluster_preset(std::string_view spec);
std::vector<std::string> cluster_preset_names();
bool is_cluster_preset(std::string_view spec);

}  // namespace tessel::plan
