// Layouts as text (planner.h): the `--layout` string, a layout's one-line form and the
// `parallel:` YAML section `tessel plan --format yaml` and `--plan auto` write.
#include "tessel/plan/planner.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "tessel/core/error.h"
#include "tessel/core/limits.h"
#include "tessel/parallel/schedule.h"

namespace tessel::plan {

// ---------------------------------------------------------------- layouts as text

std::string Layout::str() const {
  // ep and cp only where used, so the layouts without them read as before.
  const std::string experts = ep > 1 ? fmt::format(",ep={}", ep) : "";
  const std::string context = cp > 1 ? fmt::format(",cp={},cp_method={}", cp, cp_method) : "";
  return fmt::format("dp={},tp={},pp={},vpp={},mbs={},sharding_stage={},sp={},recompute={},schedule={}{}{}", dp, tp,
                     pp, vpp, micro_batch, sharding_stage, sp ? "true" : "false", recompute, schedule, experts, context);
}

Layout parse_layout(const std::string& text, int64_t global_batch, int devices) {
  Layout l;
  bool has_dp = false, has_schedule = false;
  std::stringstream in(text);
  std::string item;
  auto number = [&](const std::string& key, const std::string& v) {
    size_t used = 0;
    long long x = 0;
    try {
      x = std::stoll(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TESSEL_CHECK_AS(InputError, used == v.size() && x >= 0, "--layout: {}={} is not a non-negative integer", key, v);
    return static_cast<int64_t>(x);
  };
  // Degrees are read as 64 bits and bounded before they become a Layout's ints.
  auto degree = [&](const std::string& key, const std::string& v) {
    const int64_t x = number(key, v);
    TESSEL_CHECK_AS(InputError, x <= kMaxDevices, "--layout: {}={} is more than {}, the most devices tessel plans (2^20)",
                    key, v, kMaxDevices);
    return static_cast<int>(x);
  };
  std::set<std::string> seen;
  TESSEL_CHECK(!text.empty(), "--layout: empty; give key=value pairs such as dp=2,tp=4,pp=2 (or leave --layout out to "
                              "search)");
  while (std::getline(in, item, ',')) {
    TESSEL_CHECK(!item.empty(), "--layout '{}': an empty field between commas", text);
    const size_t eq = item.find('=');
    TESSEL_CHECK(eq != std::string::npos, "--layout: expected key=value, got '{}'", item);
    const std::string key = item.substr(0, eq), v = item.substr(eq + 1);
    TESSEL_CHECK(seen.insert(key == "micro_batch" ? "mbs" : key == "zero" ? "sharding_stage" : key).second,
                 "--layout '{}': '{}' is given twice", text, key);
    if (key == "dp") l.dp = degree(key, v), has_dp = true;
    else if (key == "tp") l.tp = degree(key, v);
    else if (key == "ep") l.ep = degree(key, v);
    else if (key == "cp") l.cp = degree(key, v);
    else if (key == "cp_method") {
      TESSEL_CHECK(v == "ring" || v == "all_to_all", "--layout: cp_method must be ring or all_to_all, got '{}'", v);
      l.cp_method = v;
    }
    else if (key == "pp") l.pp = degree(key, v);
    else if (key == "vpp") l.vpp = degree(key, v);
    else if (key == "mbs" || key == "micro_batch") l.micro_batch = number(key, v);
    else if (key == "sharding_stage" || key == "zero") l.sharding_stage = degree(key, v);
    else if (key == "sp") {
      TESSEL_CHECK(v == "true" || v == "false", "--layout: sp must be true or false, got '{}'", v);
      l.sp = v == "true";
    } else if (key == "recompute") {
      TESSEL_CHECK(v == "none" || v == "selective" || v == "full",
                   "--layout: recompute must be none, selective or full, got '{}'", v);
      l.recompute = v;
    } else if (key == "schedule") {
      l.schedule = v;
      has_schedule = true;
    } else {
      TESSEL_THROW("--layout: unknown key '{}' (known: dp, tp, pp, vpp, ep, cp, cp_method, mbs, sharding_stage, sp, "
                   "recompute, schedule)",
                   key);
    }
  }
  TESSEL_CHECK(l.tp > 0 && l.pp > 0 && l.vpp > 0 && l.ep > 0 && l.cp > 0 && l.micro_batch > 0,
               "--layout: tp, pp, vpp, ep, cp and mbs must be positive");
  TESSEL_CHECK_AS(InputError,
                  checked_product({l.dp, l.ep, l.cp, l.tp, l.pp}, kMaxDevices) && checked_product({l.pp, l.vpp}, kMaxDevices),
                  "--layout: dp {} x tp {} x pp {} x ep {} x cp {} (or pp x vpp {}) is more than {}, the most devices "
                  "tessel plans (2^20)",
                  l.dp, l.tp, l.pp, l.ep, l.cp, l.vpp, kMaxDevices);
  TESSEL_CHECK_AS(InputError, l.micro_batch <= global_batch, "--layout: mbs={} is more than the global batch {}",
                  l.micro_batch, global_batch);
  if (!has_dp) {
    const int other = l.tp * l.pp * l.ep * l.cp;
    TESSEL_CHECK(devices % other == 0, "--layout: tp {} x pp {} x ep {} x cp {} does not divide the {} devices", l.tp,
                 l.pp, l.ep, l.cp, devices);
    l.dp = devices / other;
  }
  TESSEL_CHECK(l.dp > 0, "--layout: dp must be positive");
  if (!has_schedule) l.schedule = l.vpp > 1 ? "VPP" : "1F1B";
  l.schedule = parallel::canonical_schedule_name(l.schedule);
  if (l.vpp > 1) {
    TESSEL_CHECK(l.pp > 1, "--layout: vpp={} needs pp > 1 (chunks interleave over pipeline ranks)", l.vpp);
    TESSEL_CHECK(l.schedule == "VPP", "--layout: vpp={} runs only on schedule=VPP, got schedule={}", l.vpp, l.schedule);
  }
  TESSEL_CHECK(checked_product({l.dp, l.ep, l.micro_batch}, global_batch) &&
                   global_batch % (static_cast<int64_t>(l.batch_shards()) * l.micro_batch) == 0,
               "--layout: the global batch {} is not a multiple of dp {} x ep {} x mbs {}", global_batch, l.dp, l.ep,
               l.micro_batch);
  l.micro_batches = global_batch / (static_cast<int64_t>(l.batch_shards()) * l.micro_batch);
  TESSEL_CHECK(l.vpp == 1 || l.micro_batches % l.pp == 0,
               "--layout: with vpp={} the {} micro-batches per step (global batch {} / dp {} / mbs {}) must be a multiple "
               "of pp {}",
               l.vpp, l.micro_batches, global_batch, l.dp, l.micro_batch, l.pp);
  return l;
}

std::string parallel_yaml(const Layout& l) {
  // ep and cp only where used: a section without them is what every earlier tessel read.
  const std::string experts = l.ep > 1 ? fmt::format("  ep: {}\n", l.ep) : "";
  const std::string context = l.cp > 1 ? fmt::format("  cp: {}\n  cp_method: {}\n", l.cp, l.cp_method) : "";
  return fmt::format(
      "parallel:\n  dp: {}\n  tp: {}\n  pp: {}\n  vpp: {}\n{}{}  sharding_stage: {}\n  sp: {}\n  micro_batches: {}\n"
      "  schedule: {}\n  recompute: {}\n  bucket_mb: {}\n",
      l.dp, l.tp, l.pp, l.vpp, experts, context, l.sharding_stage, l.sp ? "true" : "false", l.micro_batches, l.schedule,
      l.recompute, l.bucket_mb);
}

}  // namespace tessel::plan
