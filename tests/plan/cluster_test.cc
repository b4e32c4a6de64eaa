// The cluster's YAML form (round trip, strict errors naming the key) and its compute share.
#include "tessel/plan/cluster.h"

#include <gtest/gtest.h>

#include <chrono>
#include <regex>

#include "tessel/core/error.h"

namespace tessel::plan {
namespace {

// Every field set to a value other than its default, with numbers that need all 17 digits.
Cluster hand_built() {
  Cluster c;
  c.name = "test-cluster";
  c.nodes = 3;
  c.devices_per_node = 4;
  c.total_devices = 10;
  c.cores_per_node = 2;
  c.dtype = "bf16";
  c.device.name = "Widget: 9000 \"GPU\"";
  c.device.peak_flops = {{"bf16", 312e12}, {"f32", 19.5e12}, {"tf32", 1.0 / 3.0 * 1e14}};
  c.device.memory_bytes = 80e9;
  c.device.memory_bandwidth = 2.039e12;
  c.intra = Link{"nvswitch", 300e9, 5e-6};
  c.inter = Link{"infiniband", 25e9 + 0.1, 1e-5};
  c.nics_per_node = 8;
  c.calibration.gemm_efficiency = 0.7;
  c.calibration.gemm_half_dim = 100.0 / 7.0;
  c.calibration.gemm_size = "harmonic";
  c.calibration.memory_efficiency = 0.9;
  c.calibration.link_efficiency = 1.0;
  c.calibration.inter_link_efficiency = 0.93;
  c.calibration.sources = {{"gemm_efficiency", "measured: 70% of 312 TFLOP/s\nsecond line"}};
  c.software.name = "my stack";
  c.software.fused_attention = false;
  c.software.attention_efficiency = 1.25;
  c.software.attention_half_dim = 250;
  c.software.optimizer_efficiency = 0.75;
  c.software.kernel_efficiency = 0.9;
  c.software.op_overhead = 3.3e-6;
  c.software.step_overhead = 0.01;
  c.software.loss_fwd_bytes = 38;
  c.software.loss_bwd_bytes = 14.5;
  c.software.overlap = Overlap{true, false, true, false};
  c.software.fragmentation = 0.05;
  c.software.reserved_bytes = 2e9;
  c.software.sources = {{"op_overhead", "yes"}};
  return c;
}

void expect_equal(const Cluster& a, const Cluster& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.nodes, b.nodes);
  EXPECT_EQ(a.devices_per_node, b.devices_per_node);
  EXPECT_EQ(a.total_devices, b.total_devices);
  EXPECT_EQ(a.cores_per_node, b.cores_per_node);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.device.name, b.device.name);
  EXPECT_EQ(a.device.peak_flops, b.device.peak_flops);  // exact: numbers round-trip
  EXPECT_EQ(a.device.memory_bytes, b.device.memory_bytes);
  EXPECT_EQ(a.device.memory_bandwidth, b.device.memory_bandwidth);
  for (auto [x, y] : {std::pair{&a.intra, &b.intra}, std::pair{&a.inter, &b.inter}}) {
    EXPECT_EQ(x->kind, y->kind);
    EXPECT_EQ(x->bandwidth, y->bandwidth);
    EXPECT_EQ(x->latency, y->latency);
  }
  EXPECT_EQ(a.nics_per_node, b.nics_per_node);
  const Calibration &p = a.calibration, &q = b.calibration;
  EXPECT_EQ(p.gemm_efficiency, q.gemm_efficiency);
  EXPECT_EQ(p.gemm_half_dim, q.gemm_half_dim);
  EXPECT_EQ(p.gemm_size, q.gemm_size);
  EXPECT_EQ(p.memory_efficiency, q.memory_efficiency);
  EXPECT_EQ(p.link_efficiency, q.link_efficiency);
  EXPECT_EQ(p.inter_link_efficiency, q.inter_link_efficiency);
  EXPECT_EQ(p.sources, q.sources);
  const SoftwareProfile &s = a.software, &t = b.software;
  EXPECT_EQ(s.name, t.name);
  EXPECT_EQ(s.fused_attention, t.fused_attention);
  EXPECT_EQ(s.attention_efficiency, t.attention_efficiency);
  EXPECT_EQ(s.attention_half_dim, t.attention_half_dim);
  EXPECT_EQ(s.optimizer_efficiency, t.optimizer_efficiency);
  EXPECT_EQ(s.kernel_efficiency, t.kernel_efficiency);
  EXPECT_EQ(s.op_overhead, t.op_overhead);
  EXPECT_EQ(s.step_overhead, t.step_overhead);
  EXPECT_EQ(s.loss_fwd_bytes, t.loss_fwd_bytes);
  EXPECT_EQ(s.loss_bwd_bytes, t.loss_bwd_bytes);
  EXPECT_EQ(s.overlap.tp_comm, t.overlap.tp_comm);
  EXPECT_EQ(s.overlap.grad_reduce, t.overlap.grad_reduce);
  EXPECT_EQ(s.overlap.param_gather, t.overlap.param_gather);
  EXPECT_EQ(s.overlap.p2p, t.overlap.p2p);
  EXPECT_EQ(s.fragmentation, t.fragmentation);
  EXPECT_EQ(s.reserved_bytes, t.reserved_bytes);
  EXPECT_EQ(s.sources, t.sources);
}

TEST(Cluster, YamlRoundTripKeepsEveryField) {
  Cluster c = hand_built();
  std::string yaml = c.to_yaml();
  Cluster back = parse_cluster(yaml, "round.yaml");
  expect_equal(c, back);
  EXPECT_EQ(back.to_yaml(), yaml);
}

TEST(Cluster, YamlWritesEngineeringNumbers) {
  std::string yaml = hand_built().to_yaml();
  for (const char* want : {"bf16: 312e12", "f32: 19.5e12", "memory_bytes: 80e9", "memory_bandwidth: 2.039e12",
                           "bandwidth: 300e9, latency: 5e-6", "latency: 10e-6", "gemm_efficiency: 0.7"})
    EXPECT_NE(yaml.find(want), std::string::npos) << want << " not in\n" << yaml;
}

TEST(Cluster, SingleNodeWithoutInterRoundTrips) {
  Cluster c = hand_built();
  c.nodes = 1;
  c.total_devices = 0;
  c.inter = Link{};
  std::string yaml = c.to_yaml();
  EXPECT_EQ(yaml.find("inter:"), std::string::npos);
  expect_equal(c, parse_cluster(yaml, "one.yaml"));
}

const char* kMinimal = R"(name: small
nodes: 2
devices_per_node: 8
dtype: bf16
device:
  name: A100-SXM4-80GB
  peak_flops: {bf16: 312e12, f32: 19.5e12}
  memory_bytes: 80e9
  memory_bandwidth: 2.039e12
intra: {kind: nvswitch, bandwidth: 300e9, latency: 5e-6}
inter: {kind: infiniband, bandwidth: 25e9, latency: 10e-6}
)";

TEST(Cluster, MissingOptionalKeysTakeDefaults) {
  Cluster c = parse_cluster(kMinimal, "min.yaml");
  Cluster defaults;
  EXPECT_EQ(c.devices(), 16);
  EXPECT_EQ(c.total_devices, 0);
  EXPECT_EQ(c.cores_per_node, 0);
  EXPECT_EQ(c.nics_per_node, 0);
  EXPECT_DOUBLE_EQ(c.peak(), 312e12);
  EXPECT_DOUBLE_EQ(c.inter.latency, 10e-6);
  EXPECT_EQ(c.calibration.gemm_efficiency, defaults.calibration.gemm_efficiency);
  EXPECT_EQ(c.calibration.gemm_half_dim, defaults.calibration.gemm_half_dim);
  EXPECT_EQ(c.software.fragmentation, defaults.software.fragmentation);
  EXPECT_EQ(c.software.name, "default");
  EXPECT_TRUE(c.calibration.sources.empty());
}

// A cluster names its software profile (a named one, or a mapping over one), apart from the
// device; presets carry the profile their device is most often planned with.
TEST(Cluster, SoftwareProfileByNameOrMapping) {
  Cluster named = parse_cluster(std::string(kMinimal) + "software: megatron-core-r0.8\n", "c.yaml");
  EXPECT_EQ(named.software.name, "megatron-core-r0.8");
  EXPECT_TRUE(named.software.overlap.tp_comm && named.software.overlap.grad_reduce);
  Cluster over = parse_cluster(std::string(kMinimal) + "software:\n  name: megatron-core-r0.8\n  overlap: {tp_comm: false}\n",
                               "c.yaml");
  EXPECT_FALSE(over.software.overlap.tp_comm);
  EXPECT_TRUE(over.software.overlap.grad_reduce);  // the rest from the named profile
  EXPECT_EQ(over.software.sources, software_profile("megatron-core-r0.8").sources);
  EXPECT_EQ(cluster_preset("dgx-a100-80g:8").software.name, "megatron-2021");
  EXPECT_FALSE(cluster_preset("dgx-a100-80g:8").software.fused_attention);
  EXPECT_EQ(cluster_preset("dgx-h100:8").software.name, "megatron-core-r0.8");
  for (const std::string& n : software_profile_names()) {
    const SoftwareProfile p = software_profile(n);
    EXPECT_EQ(p.name, n);
    EXPECT_FALSE(p.sources.empty()) << n;
    EXPECT_TRUE(p.sources.count("overlap")) << n;
  }
  EXPECT_THROW(software_profile("nope"), InputError);
}

TEST(Cluster, NameDefaultsToOrigin) {
  std::string text = kMinimal;
  text.erase(0, text.find('\n') + 1);
  EXPECT_EQ(parse_cluster(text, "my.yaml").name, "my.yaml");
}

// Replaces the first occurrence of `from` in the minimal cluster.
std::string edited(const std::string& from, const std::string& to) {
  std::string text = kMinimal;
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

struct ErrorCase {
  const char* what;
  std::string yaml;
  std::vector<std::string> message_has;  // every one must appear in the message
};

TEST(Cluster, BadInputThrowsNamingTheKey) {
  const std::string calib = "calibration:\n  gemm_efficiency: ";
  std::vector<ErrorCase> cases = {
      {"unknown key in device", edited("  peak_flops:", "  peek_flops:"),
       {"c.yaml:7:", "unknown key 'device.peek_flops'", "known: name, peak_flops, memory_bytes, memory_bandwidth"}},
      {"unknown top-level key", std::string(kMinimal) + "node: 3\n", {"c.yaml:12:", "unknown key 'node'"}},
      {"unknown calibration key", std::string(kMinimal) + "calibration:\n  gemm_eff: 0.5\n",
       {"c.yaml:13:", "unknown key 'calibration.gemm_eff'"}},
      {"negative bandwidth", edited("bandwidth: 25e9", "bandwidth: -25e9"),
       {"c.yaml:11:", "'inter.bandwidth' must be positive", "got -25e9"}},
      {"zero bandwidth", edited("bandwidth: 300e9", "bandwidth: 0"), {"'intra.bandwidth' must be positive"}},
      {"negative latency", edited("latency: 5e-6", "latency: -1"), {"'intra.latency' must be zero or positive"}},
      {"efficiency above one", std::string(kMinimal) + calib + "1.2\n",
       {"c.yaml:13:", "'calibration.gemm_efficiency' must be in (0, 1]", "1.2"}},
      {"efficiency zero", std::string(kMinimal) + "calibration:\n  link_efficiency: 0\n",
       {"'calibration.link_efficiency' must be in (0, 1]"}},
      {"attention efficiency above two", std::string(kMinimal) + "software:\n  attention_efficiency: 2.5\n",
       {"c.yaml:13:", "'software.attention_efficiency' must be in (0, 2]", "2.5"}},
      {"fragmentation one", std::string(kMinimal) + "software:\n  fragmentation: 1\n",
       {"'software.fragmentation' must be in [0, 1)"}},
      {"software key under calibration", std::string(kMinimal) + "calibration:\n  op_overhead: 5e-6\n",
       {"c.yaml:13:", "'calibration.op_overhead' is the software's", "'software.op_overhead'"}},
      {"unknown software profile", std::string(kMinimal) + "software: megatron-2030\n",
       {"c.yaml:12:", "'software' megatron-2030 is not a profile", "megatron-core-r0.8"}},
      {"unknown overlap key", std::string(kMinimal) + "software:\n  overlap: {dp: true}\n",
       {"unknown key 'software.overlap.dp'"}},
      {"unknown gemm size", std::string(kMinimal) + "calibration:\n  gemm_size: mean\n",
       {"c.yaml:13:", "'calibration.gemm_size' must be smallest or harmonic", "'mean'"}},
      {"missing peak for dtype", edited("dtype: bf16", "dtype: f16"),
       {"c.yaml:7:", "'device.peak_flops' has no entry for dtype 'f16'", "has: bf16, f32"}},
      {"negative peak", edited("f32: 19.5e12", "f32: -1"), {"'device.peak_flops.f32' must be positive"}},
      {"zero nodes", edited("nodes: 2", "nodes: 0"), {"c.yaml:2:", "'nodes' must be positive"}},
      {"negative devices per node", edited("devices_per_node: 8", "devices_per_node: -8"),
       {"'devices_per_node' must be positive"}},
      {"fractional nodes", edited("nodes: 2", "nodes: 2.5"), {"'nodes' must be an integer", "2.5"}},
      {"text for a number", edited("memory_bytes: 80e9", "memory_bytes: lots"),
       {"c.yaml:8:", "'device.memory_bytes' must be a number", "lots"}},
      {"zero memory", edited("memory_bytes: 80e9", "memory_bytes: 0"), {"'device.memory_bytes' must be positive"}},
      {"missing memory bandwidth", edited("  memory_bandwidth: 2.039e12\n", ""),
       {"missing 'device.memory_bandwidth'"}},
      {"missing device", edited("device:", "devicez:"), {"missing 'device'"}},
      {"missing inter with two nodes", edited("inter: {kind: infiniband, bandwidth: 25e9, latency: 10e-6}\n", ""),
       {"missing 'inter'", "nodes 2"}},
      {"total devices beyond nodes", std::string(kMinimal) + "total_devices: 17\n",
       {"'total_devices' 17 does not fit"}},
      {"link as a number", edited("intra: {kind: nvswitch, bandwidth: 300e9, latency: 5e-6}", "intra: 3"),
       {"'intra' must be a mapping"}},
      {"not yaml", edited("nodes: 2", "nodes: [2"), {"c.yaml", "not valid YAML"}},
  };
  cases.push_back({"inter-node efficiency above one",
                   std::string(kMinimal) + "calibration:\n  inter_link_efficiency: 2\n",
                   {"'calibration.inter_link_efficiency' must be in (0, 1]"}});
  for (const ErrorCase& c : cases) {
    SCOPED_TRACE(c.what);
    try {
      parse_cluster(c.yaml, "c.yaml");
      ADD_FAILURE() << "no error for:\n" << c.yaml;
    } catch (const Error& e) {
      for (const std::string& part : c.message_has)
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "'" << part << "' not in: " << e.what();
    }
  }
}

// Counts are read in 64 bits and bounded (2^20 devices): 2^31 devices once wrapped to a negative
// or tiny count and planned. Keys given twice, keys that are not names and aliases that expand
// past the reader's bound are refused before any walk. All InputErrors (exit status 2).
TEST(Cluster, RefusesHugeCountsDuplicateKeysAndAliasBombs) {
  std::string bomb = std::string(kMinimal) + "calibration:\n  sources:\n    a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 9; ++i) {
    bomb += fmt::format("    a{}: &a{} [", i, i);
    for (int k = 0; k < 10; ++k) bomb += fmt::format("{}*a{}", k ? "," : "", i - 1);
    bomb += "]\n";
  }
  std::vector<ErrorCase> cases = {
      {"nodes past int", edited("nodes: 2", "nodes: 2147483648"), {"c.yaml:2:", "'nodes' must be at most 1048576"}},
      {"devices per node past the bound", edited("devices_per_node: 8", "devices_per_node: 1048577"),
       {"'devices_per_node' must be at most 1048576"}},
      {"a product past the bound", edited("nodes: 2", "nodes: 1048576"),
       {"c.yaml:2:", "'nodes' 1048576 x 'devices_per_node' 8 is more than 1048576 devices"}},
      {"a product past int", std::regex_replace(edited("nodes: 2", "nodes: 65536"), std::regex("devices_per_node: 8"),
                                                "devices_per_node: 65536"),
       {"'nodes' 65536 x 'devices_per_node' 65536 is more than 1048576 devices"}},
      {"total devices past int", std::string(kMinimal) + "total_devices: 4294967296\n",
       {"'total_devices' must be at most 1048576"}},
      {"a key twice", std::string(kMinimal) + "nodes: 3\n", {"c.yaml:12:", "key 'nodes' is given twice (first at line 2)"}},
      {"a key twice in a section", edited("  name: A100-SXM4-80GB", "  name: A\n  name: B"),
       {"c.yaml:7:", "key 'device.name' is given twice (first at line 6)"}},
      {"a key that is a list", std::string(kMinimal) + "[a]: 1\n", {"c.yaml:12:", "a key must be a plain name"}},
      {"aliases expanding to 10^9 nodes", bomb, {"c.yaml:", "more than 100000 nodes with its aliases"}},
  };
  for (const ErrorCase& c : cases) {
    SCOPED_TRACE(c.what);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      parse_cluster(c.yaml, "c.yaml");
      ADD_FAILURE() << "no error for:\n" << c.yaml;
    } catch (const InputError& e) {
      for (const std::string& part : c.message_has)
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "'" << part << "' not in: " << e.what();
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  }
  // Presets: the count is 64-bit and bounded as well.
  EXPECT_EQ(cluster_preset("dgx-a100-80g:1048576").devices(), 1048576);
  for (const char* spec : {"dgx-a100-80g:1048577", "dgx-a100-80g:2147483647", "dgx-a100-80g:99999999999999999999"})
    EXPECT_THROW(cluster_preset(spec), InputError) << spec;
}

TEST(Cluster, PeakNamesTheMissingDtype) {
  Cluster c = hand_built();
  EXPECT_EQ(c.peak(), 312e12);
  c.dtype = "f16";
  try {
    c.peak();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("'f16'"), std::string::npos) << m;
    EXPECT_NE(m.find("bf16, f32, tf32"), std::string::npos) << m;
  }
}

TEST(Cluster, ComputeShare) {
  struct Case {
    int cores, used;
    double share;
  };
  for (Case k : std::vector<Case>{{0, 8, 1.0}, {0, 1000, 1.0}, {4, 1, 1.0}, {4, 4, 1.0}, {4, 8, 0.5}, {2, 3, 2.0 / 3.0},
                                  {1, 16, 1.0 / 16}}) {
    Cluster c;
    c.cores_per_node = k.cores;
    EXPECT_DOUBLE_EQ(c.compute_share(k.used), k.share) << k.cores << " cores, " << k.used << " devices";
  }
}

TEST(Cluster, DevicesCountsTheLastPartialNode) {
  Cluster c;
  c.nodes = 3;
  c.devices_per_node = 4;
  EXPECT_EQ(c.devices(), 12);
  c.total_devices = 10;
  EXPECT_EQ(c.devices(), 10);
}

}  // namespace
}  // namespace tessel::plan
