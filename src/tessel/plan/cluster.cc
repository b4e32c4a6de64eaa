// Cluster values: the peak and compute share a cost model reads, and the strict YAML form.
//
// The YAML reader follows the training config's (cli/config.cc): each mapping is a Section
// whose keys are consumed one by one; whatever is left over is an unknown key, reported with
// its full path and line. Numbers are written as the shortest text that reads back to the same
// double, with engineering exponents for large and small values (312e12, 5e-6).
#include "tessel/plan/cluster.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>

#include "tessel/core/error.h"
#include "tessel/core/limits.h"
#include "tessel/core/yaml_guard.h"

namespace tessel::plan {

namespace {

std::string join_keys(const std::map<std::string, double>& m) {
  std::string out;
  for (const auto& [k, v] : m) out += (out.empty() ? "" : ", ") + k;
  return out.empty() ? "none" : out;
}

// ---- reading ----

std::string mark_text(const YAML::Mark& m, const std::string& origin) {
  return m.line < 0 ? origin : fmt::format("{}:{}", origin, m.line + 1);
}

std::string where(const YAML::Node& n, const std::string& origin) { return mark_text(n.Mark(), origin); }

// A mapping whose keys are consumed one by one; finish() rejects anything left over. Keys are
// remembered in the order read, which is the order the YAML form writes them.
class Section {
 public:
  Section(YAML::Node node, std::string path, const std::string& origin)
      : node_(std::move(node)), path_(std::move(path)), origin_(origin) {
    TESSEL_CHECK(!node_ || node_.IsNull() || node_.IsMap(), "{}: '{}' must be a mapping of keys", where(node_, origin_),
                 path_);
  }

  bool has(const std::string& key) const { return node_ && node_.IsMap() && node_[key]; }
  YAML::Node node(const std::string& key) {
    know(key);
    return has(key) ? node_[key] : YAML::Node();
  }
  Section sub(const std::string& key) { return Section(node(key), full(key), origin_); }

  template <typename T>
  T get(const std::string& key, T fallback) {
    know(key);
    return has(key) ? convert<T>(key) : fallback;
  }
  template <typename T>
  T require(const std::string& key) {
    know(key);
    TESSEL_CHECK(has(key), "{}: missing '{}'", where(node_, origin_), full(key));
    return convert<T>(key);
  }

  // Numbers with a range; `fallback` empty: the key is required.
  double positive(const std::string& key, std::optional<double> fallback = {}) {
    double v = number(key, fallback);
    check(key, v > 0, v, "positive");
    return v;
  }
  double non_negative(const std::string& key, double fallback) {
    double v = number(key, fallback);
    check(key, v >= 0, v, "zero or positive");
    return v;
  }
  // A share in (0, 1], or in (0, most] where the FLOPs counted exceed those run.
  double efficiency(const std::string& key, double fallback, double most = 1) {
    double v = number(key, fallback);
    check(key, v > 0 && v <= most, v, fmt::format("in (0, {}]", most).c_str());
    return v;
  }
  // A count read as 64 bits and bounded by `most`, so it fits an int and products of two fit
  // an int64 (a 32-bit read wrapped 2^31 devices into a negative count).
  int count(const std::string& key, int fallback, int min, int64_t most) {
    int64_t v = get<int64_t>(key, fallback);
    check(key, v >= min, v, min == 0 ? "zero or positive" : "positive");
    check(key, v <= most, v, fmt::format("at most {}", most).c_str());
    return static_cast<int>(v);
  }

  void finish() const {
    if (!node_ || !node_.IsMap()) return;
    for (const auto& kv : node_) {
      std::string key = kv.first.as<std::string>();
      if (std::find(known_.begin(), known_.end(), key) != known_.end()) continue;
      std::string list;
      for (const std::string& k : known_) list += (list.empty() ? "" : ", ") + k;
      TESSEL_THROW("{}: unknown key '{}' (known: {})", where(kv.first, origin_), full(key), list);
    }
  }

  std::string full(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  std::string at(const std::string& key) const { return where(has(key) ? node_[key] : node_, origin_); }
  const YAML::Node& yaml() const { return node_; }

 private:
  void know(const std::string& key) {
    if (std::find(known_.begin(), known_.end(), key) == known_.end()) known_.push_back(key);
  }
  double number(const std::string& key, std::optional<double> fallback) {
    double v = fallback ? get<double>(key, *fallback) : require<double>(key);
    check(key, std::isfinite(v), v, "a finite number");
    return v;
  }
  // Shows the value as the text wrote it (-25e9, not -2.5e+10).
  template <typename V>
  void check(const std::string& key, bool ok, V value, const char* what) const {
    TESSEL_CHECK(ok, "{}: '{}' must be {}, got {}", at(key), full(key), what,
                 has(key) ? node_[key].Scalar() : fmt::format("{}", value));
  }
  template <typename T>
  T convert(const std::string& key) const {
    const YAML::Node v = node_[key];
    TESSEL_CHECK(v.IsScalar(), "{}: '{}' must be a single value", where(v, origin_), full(key));
    try {
      return v.as<T>();
    } catch (const YAML::Exception&) {
      const char* expected = std::is_integral_v<T> ? "an integer" : std::is_floating_point_v<T> ? "a number" : "a string";
      TESSEL_THROW("{}: '{}' must be {}, got '{}'", where(v, origin_), full(key), expected, v.Scalar());
    }
  }

  YAML::Node node_;
  std::string path_;
  const std::string& origin_;
  std::vector<std::string> known_;
};

Link read_link(Section s) {
  Link l;
  l.kind = s.require<std::string>("kind");
  l.bandwidth = s.positive("bandwidth");
  l.latency = s.non_negative("latency", 0);
  s.finish();
  return l;
}

// Entries of a mapping whose keys are free (dtypes, source names).
template <typename T>
std::map<std::string, T> read_map(Section s, const std::function<T(Section&, const std::string&)>& value) {
  std::map<std::string, T> out;
  if (!s.yaml() || s.yaml().IsNull()) return out;
  for (const auto& kv : s.yaml()) {
    std::string key = kv.first.as<std::string>();
    out[key] = value(s, key);
  }
  s.finish();
  return out;
}

Device read_device(Section s) {
  Device d;
  d.name = s.get<std::string>("name", "");
  d.peak_flops = read_map<double>(s.sub("peak_flops"), [](Section& p, const std::string& k) { return p.positive(k); });
  d.memory_bytes = s.positive("memory_bytes");
  d.memory_bandwidth = s.positive("memory_bandwidth");
  s.finish();
  return d;
}

Calibration read_calibration(Section s) {
  Calibration c;
  // What a software profile says now lives under `software:` (docs/plan.md).
  for (const char* moved : {"op_overhead", "attention_efficiency", "attention_half_dim", "optimizer_efficiency",
                            "fused_attention", "fragmentation", "reserved_bytes"})
    TESSEL_CHECK(!s.has(moved), "{}: '{}' is the software's, not the device's: write it as 'software.{}' (a profile "
                 "name or a mapping; see docs/plan.md)", s.at(moved), s.full(moved), moved);
  c.gemm_efficiency = s.efficiency("gemm_efficiency", c.gemm_efficiency);
  c.gemm_half_dim = s.non_negative("gemm_half_dim", c.gemm_half_dim);
  c.gemm_size = s.get<std::string>("gemm_size", c.gemm_size);
  TESSEL_CHECK(c.gemm_size == "smallest" || c.gemm_size == "harmonic", "{}: '{}' must be smallest or harmonic, got '{}'",
               s.at("gemm_size"), s.full("gemm_size"), c.gemm_size);
  c.memory_efficiency = s.efficiency("memory_efficiency", c.memory_efficiency);
  c.link_efficiency = s.efficiency("link_efficiency", c.link_efficiency);
  if (s.has("inter_link_efficiency"))
    c.inter_link_efficiency = s.efficiency("inter_link_efficiency", c.inter_link_efficiency);
  c.sources = read_map<std::string>(s.sub("sources"),
                                    [](Section& p, const std::string& k) { return p.require<std::string>(k); });
  s.finish();
  return c;
}

// `software: NAME` (a named profile) or a mapping: `name` (a named profile to start from, or a
// new name) and any of the profile's keys over it.
SoftwareProfile read_software(Section& parent, const std::string& origin) {
  const YAML::Node n = parent.node("software");
  if (!n || n.IsNull()) return SoftwareProfile{};
  if (n.IsScalar()) {
    const std::string name = n.Scalar();
    TESSEL_CHECK(is_software_profile(name), "{}: 'software' {} is not a profile (known: {}; or a mapping of the "
                 "profile's keys)", where(n, origin), name, fmt::join(software_profile_names(), ", "));
    return software_profile(name);
  }
  Section s(n, "software", origin);
  const std::string name = s.get<std::string>("name", "custom");
  SoftwareProfile p = is_software_profile(name) ? software_profile(name) : SoftwareProfile{};
  p.name = name;
  p.fused_attention = s.get<bool>("fused_attention", p.fused_attention);
  // Up to 2: a causal kernel skips the masked half of the FLOPs that sdpa's cost counts; up to 4
  // with a half-dim of its own, where it is the share as the query length grows (capped in the cost model).
  p.attention_half_dim = s.non_negative("attention_half_dim", p.attention_half_dim);
  p.attention_efficiency =
      s.efficiency("attention_efficiency", p.attention_efficiency, p.attention_half_dim > 0 ? 4 : 2);
  p.kernel_efficiency = s.efficiency("kernel_efficiency", p.kernel_efficiency);
  p.op_overhead = s.non_negative("op_overhead", p.op_overhead);
  p.optimizer_efficiency = s.efficiency("optimizer_efficiency", p.optimizer_efficiency, 2);
  p.loss_fwd_bytes = s.non_negative("loss_fwd_bytes", p.loss_fwd_bytes);
  p.loss_bwd_bytes = s.non_negative("loss_bwd_bytes", p.loss_bwd_bytes);
  p.step_overhead = s.non_negative("step_overhead", p.step_overhead);
  Section o = s.sub("overlap");
  p.overlap.tp_comm = o.get<bool>("tp_comm", p.overlap.tp_comm);
  p.overlap.grad_reduce = o.get<bool>("grad_reduce", p.overlap.grad_reduce);
  p.overlap.param_gather = o.get<bool>("param_gather", p.overlap.param_gather);
  p.overlap.p2p = o.get<bool>("p2p", p.overlap.p2p);
  o.finish();
  p.fragmentation = s.non_negative("fragmentation", p.fragmentation);
  TESSEL_CHECK(p.fragmentation < 1, "{}: '{}' must be in [0, 1), got {}", s.at("fragmentation"),
               s.full("fragmentation"), p.fragmentation);
  p.reserved_bytes = s.non_negative("reserved_bytes", p.reserved_bytes);
  if (s.has("sources"))
    p.sources = read_map<std::string>(s.sub("sources"),
                                      [](Section& q, const std::string& k) { return q.require<std::string>(k); });
  else
    s.node("sources");
  s.finish();
  return p;
}

Cluster read_cluster(const YAML::Node& root, const std::string& origin) {
  Section s(root, "", origin);
  Cluster c;
  c.name = s.get<std::string>("name", origin);
  c.nodes = s.count("nodes", c.nodes, 1, kMaxDevices);
  c.devices_per_node = s.count("devices_per_node", c.devices_per_node, 1, kMaxDevices);
  TESSEL_CHECK(checked_product({c.nodes, c.devices_per_node}, kMaxDevices),
               "{}: 'nodes' {} x 'devices_per_node' {} is more than {} devices, the most tessel plans (2^20)",
               s.at("nodes"), c.nodes, c.devices_per_node, kMaxDevices);
  c.total_devices = s.count("total_devices", c.total_devices, 0, kMaxDevices);
  TESSEL_CHECK(c.total_devices == 0 ||
                   (c.total_devices > (c.nodes - 1) * c.devices_per_node && c.total_devices <= c.nodes * c.devices_per_node),
               "{}: 'total_devices' {} does not fit nodes {} x devices_per_node {} (the last node holds 1..{} devices)",
               s.at("total_devices"), c.total_devices, c.nodes, c.devices_per_node, c.devices_per_node);
  c.cores_per_node = s.count("cores_per_node", c.cores_per_node, 0, kMaxDevices);
  c.dtype = s.get<std::string>("dtype", c.dtype);
  TESSEL_CHECK(s.has("device"), "{}: missing 'device' (name, peak_flops, memory_bytes, memory_bandwidth)", origin);
  c.device = read_device(s.sub("device"));
  TESSEL_CHECK(c.device.peak_flops.count(c.dtype), "{}: 'device.peak_flops' has no entry for dtype '{}' (has: {})",
               Section(root["device"], "device", origin).at("peak_flops"), c.dtype,
               join_keys(c.device.peak_flops));
  TESSEL_CHECK(s.has("intra"), "{}: missing 'intra' (kind, bandwidth, latency)", origin);
  c.intra = read_link(s.sub("intra"));
  if (s.has("inter")) {
    c.inter = read_link(s.sub("inter"));
  } else {
    s.node("inter");
    TESSEL_CHECK(c.nodes == 1, "{}: missing 'inter' (kind, bandwidth, latency): needed with nodes {}", origin, c.nodes);
  }
  c.nics_per_node = s.count("nics_per_node", c.nics_per_node, 0, kMaxDevices);
  c.calibration = read_calibration(s.sub("calibration"));
  c.software = read_software(s, origin);
  s.finish();
  return c;
}

// ---- writing ----

// Shortest text that reads back to `x`: plain between 1e-3 and 1e6, else mantissa and an
// exponent that is a multiple of three (19.5e12, 5e-6, 10e-6).
std::string number_text(double x) {
  double a = std::fabs(x);
  if (a == 0 || !std::isfinite(x) || (a >= 1e-3 && a < 1e6)) return fmt::format("{}", x);
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, a, std::chars_format::scientific);  // d.ddde±XX
  std::string s(buf, r.ptr);
  size_t e = s.find('e');
  int exp = std::atoi(s.c_str() + e + 1);
  std::string digits = s.substr(0, e);
  if (digits.size() > 1) digits.erase(1, 1);  // drop the point
  int exp3 = static_cast<int>(std::floor(exp / 3.0)) * 3;
  size_t whole = static_cast<size_t>(1 + exp - exp3);  // 1..3 digits before the point
  if (digits.size() < whole) digits.append(whole - digits.size(), '0');
  std::string out = (x < 0 ? "-" : "") + digits.substr(0, whole);
  if (digits.size() > whole) out += "." + digits.substr(whole);
  return out + "e" + std::to_string(exp3);
}

// A string as a plain YAML scalar where that reads back as the same string, else quoted.
std::string string_text(const std::string& s) {
  bool plain = !s.empty() && std::isalpha(static_cast<unsigned char>(s[0]));
  for (char c : s)
    plain = plain && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == '/');
  static const char* kReserved[] = {"true", "false", "yes", "no", "on", "off", "y", "n", "null"};
  std::string lower;
  for (char c : s) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* r : kReserved) plain = plain && lower != r;
  if (plain) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += {'\\', c};
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (static_cast<unsigned char>(c) < 0x20) out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
    else out += c;
  }
  return out + "\"";
}

std::string link_text(const Link& l) {
  return fmt::format("{{kind: {}, bandwidth: {}, latency: {}}}", string_text(l.kind), number_text(l.bandwidth),
                     number_text(l.latency));
}

}  // namespace

double Cluster::peak() const {
  auto it = device.peak_flops.find(dtype);
  TESSEL_CHECK(it != device.peak_flops.end(),
               "cluster '{}': device '{}' has no peak_flops for dtype '{}' (device.peak_flops has: {})", name,
               device.name, dtype, join_keys(device.peak_flops));
  return it->second;
}

double Cluster::compute_share(int devices_used_per_node) const {
  if (cores_per_node == 0 || devices_used_per_node <= cores_per_node) return 1.0;
  return static_cast<double>(cores_per_node) / devices_used_per_node;
}

std::string Cluster::to_yaml() const {
  std::string y;
  auto line = [&](std::string_view text) { (y += text) += '\n'; };
  line(fmt::format("name: {}", string_text(name)));
  line(fmt::format("nodes: {}", nodes));
  line(fmt::format("devices_per_node: {}", devices_per_node));
  if (total_devices > 0) line(fmt::format("total_devices: {}", total_devices));  // absent: every device of every node
  line(fmt::format("cores_per_node: {}", cores_per_node));
  line(fmt::format("dtype: {}", string_text(dtype)));
  line("device:");
  line(fmt::format("  name: {}", string_text(device.name)));
  std::string peaks;
  for (const auto& [k, v] : device.peak_flops)
    peaks += fmt::format("{}{}: {}", peaks.empty() ? "" : ", ", string_text(k), number_text(v));
  line(fmt::format("  peak_flops: {{{}}}", peaks));
  line(fmt::format("  memory_bytes: {}", number_text(device.memory_bytes)));
  line(fmt::format("  memory_bandwidth: {}", number_text(device.memory_bandwidth)));
  line(fmt::format("intra: {}", link_text(intra)));
  // A single node has no inter-node link; one left unset is not written (it would not parse).
  if (!inter.kind.empty() || inter.bandwidth > 0) line(fmt::format("inter: {}", link_text(inter)));
  line(fmt::format("nics_per_node: {}", nics_per_node));
  const Calibration& c = calibration;
  line("calibration:");
  line(fmt::format("  gemm_efficiency: {}", number_text(c.gemm_efficiency)));
  line(fmt::format("  gemm_half_dim: {}", number_text(c.gemm_half_dim)));
  line(fmt::format("  gemm_size: {}", c.gemm_size));
  line(fmt::format("  memory_efficiency: {}", number_text(c.memory_efficiency)));
  line(fmt::format("  link_efficiency: {}", number_text(c.link_efficiency)));
  if (c.inter_link_efficiency > 0)
    line(fmt::format("  inter_link_efficiency: {}", number_text(c.inter_link_efficiency)));
  if (c.sources.empty()) {
    line("  sources: {}");
  } else {
    line("  sources:");
    for (const auto& [k, v] : c.sources) line(fmt::format("    {}: {}", string_text(k), string_text(v)));
  }
  const SoftwareProfile& p = software;
  line("software:");
  line(fmt::format("  name: {}", string_text(p.name)));
  line(fmt::format("  fused_attention: {}", p.fused_attention ? "true" : "false"));
  line(fmt::format("  attention_efficiency: {}", number_text(p.attention_efficiency)));
  line(fmt::format("  attention_half_dim: {}", number_text(p.attention_half_dim)));
  line(fmt::format("  kernel_efficiency: {}", number_text(p.kernel_efficiency)));
  line(fmt::format("  op_overhead: {}", number_text(p.op_overhead)));
  line(fmt::format("  optimizer_efficiency: {}", number_text(p.optimizer_efficiency)));
  line(fmt::format("  loss_fwd_bytes: {}", number_text(p.loss_fwd_bytes)));
  line(fmt::format("  loss_bwd_bytes: {}", number_text(p.loss_bwd_bytes)));
  line(fmt::format("  step_overhead: {}", number_text(p.step_overhead)));
  auto flag = [](bool b) { return b ? "true" : "false"; };
  line(fmt::format("  overlap: {{tp_comm: {}, grad_reduce: {}, param_gather: {}, p2p: {}}}", flag(p.overlap.tp_comm),
                   flag(p.overlap.grad_reduce), flag(p.overlap.param_gather), flag(p.overlap.p2p)));
  line(fmt::format("  fragmentation: {}", number_text(p.fragmentation)));
  line(fmt::format("  reserved_bytes: {}", number_text(p.reserved_bytes)));
  if (p.sources.empty()) {
    line("  sources: {}");
  } else {
    line("  sources:");
    for (const auto& [k, v] : p.sources) line(fmt::format("    {}: {}", string_text(k), string_text(v)));
  }
  return y;
}

Cluster parse_cluster(const std::string& yaml_text, const std::string& origin) {
  // Aliases, keys given twice and keys that are not names are refused before any walk.
  check_yaml_text(yaml_text, origin, "key");
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw InputError(fmt::format("{}: not valid YAML: {}", mark_text(e.mark, origin), e.msg));
  }
  TESSEL_CHECK_AS(InputError, root.IsMap(), "{}: a cluster must be a mapping of keys (name, nodes, devices_per_node, device, ...)",
               origin);
  // Every error of a cluster file is the user's to fix: an InputError naming the file.
  try {
    return read_cluster(root, origin);
  } catch (const InputError&) {
    throw;
  } catch (const Error& e) {
    throw InputError(e.what());
  } catch (const YAML::Exception& e) {
    throw InputError(fmt::format("{}: {}", mark_text(e.mark, origin), e.msg));
  }
}

}  // namespace tessel::plan
