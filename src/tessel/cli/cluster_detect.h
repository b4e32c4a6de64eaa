// `tessel cluster detect`: this machine as a plan::Cluster named `local`, measured rather than
// looked up. A device is one thread rank; the figures are what one rank achieves (sgemm peak on
// its share of the cores, single-thread memcpy, the thread backend's all_reduce, the dispatch
// cost of a tiny op), so the calibration is 1.0 wherever the figure is itself the achieved roof.
#pragma once

#include <cstdint>
#include <string>

#include "tessel/plan/cluster.h"

namespace tessel {

// What hwloc says about the machine. Cache sizes are of one instance, in bytes.
struct MachineTopology {
  std::string cpu_model;
  int cores = 0, pus = 0, numa_nodes = 0;
  int64_t l1_bytes = 0, l2_bytes = 0, l3_bytes = 0;
  int l1_count = 0, l2_count = 0, l3_count = 0;
  double memory_bytes = 0;       // the OS's total (hwloc's NUMA nodes may miss hotplugged memory)
  double numa_memory_bytes = 0;  // the sum over hwloc's NUMA nodes
  // "2 physical cores, 2 PUs, 1 NUMA node, 15.6 GiB memory, L1d 32 KiB x2, L2 1 MiB x2, L3 35.8 MiB x1"
  std::string str() const;
};

MachineTopology probe_topology();

// Measures this machine for `ranks` thread ranks (0: one per physical core); `verbose` prints
// progress lines to stderr. Takes a few seconds.
plan::Cluster detect_local_cluster(int ranks, bool verbose);

// A kernel's efficiency curve lift·E·d/(d + half) through its shares of a reference rate (the
// sgemm 1024^3 rate) measured at two sizes d1 > d2: half from their ratio (within [1, 4096]),
// then E through share1 at d1. Where that E would top 1 (the kernel outran the reference rate),
// E is 1 and lift > 1 is the factor the rate is raised by, so that the curve still passes
// through the measurement at d1 — and at d2 while half is within its bounds; lift is 1 otherwise.
struct EfficiencyCurve {
  double efficiency = 1, half_dim = 1, lift = 1;
};
EfficiencyCurve fit_efficiency_curve(double share1, double share2, double d1, double d2);

// The text `tessel cluster detect` writes: comment lines on the machine and the measured figures
// in everyday units, then cluster.to_yaml().
std::string local_cluster_yaml(const plan::Cluster& cluster);

}  // namespace tessel
