// The run's timeline and metrics files (run_files.h).
#include "tessel/engine/run_files.h"

#include <filesystem>
#include <fstream>

#include "tessel/comm/world.h"
#include "tessel/core/error.h"
#include "tessel/core/json.h"

namespace tessel {

double micros_since_epoch(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count();
}

void write_trace(const std::string& path, const std::vector<TraceEvent>& events, const std::string& label) {
  auto world = world_group();
  Json mine = Json::Array{};
  for (const TraceEvent& e : events) {
    Json j = Json::Object{};
    j["name"] = e.name;
    j["cat"] = e.category;
    j["ph"] = "X";
    j["ts"] = e.start_us;
    j["dur"] = e.dur_us;
    j["pid"] = world->rank();
    j["tid"] = 0;
    mine.push_back(j);
  }
  const std::vector<std::string> parts = all_gather_strings(*world, mine.dump());
  const int n = world->size();
  if (world->rank() != 0) return;
  std::ofstream out(path);
  TESSEL_CHECK(out.good(), "cannot write trace file '{}'", path);
  out << "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"layout\":" << Json(label).dump() << "},\"traceEvents\":[";
  bool first = true;
  for (int r = 0; r < n; ++r) {
    const std::string& part = parts[static_cast<size_t>(r)];
    Json meta = Json::Object{};
    meta["name"] = "process_name";
    meta["ph"] = "M";
    meta["pid"] = r;
    Json args = Json::Object{};
    args["name"] = fmt::format("rank {}", r);
    meta["args"] = args;
    out << (first ? "" : ",") << meta.dump();
    first = false;
    if (part.size() > 2) out << "," << part.substr(1, part.size() - 2);
  }
  out << "]}\n";
  TESSEL_CHECK(out.good(), "failed writing trace file '{}'", path);
}

void keep_metrics_before(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  bool dropped = false;
  while (std::getline(in, line)) {
    int64_t s = -1;
    try {
      const Json j = Json::parse(line);
      if (const Json* v = j.is_object() ? j.find("step") : nullptr) s = v->as_int();
    } catch (const Error&) {
    }
    if (s >= step) {
      dropped = true;
      continue;
    }
    kept += line + "\n";
  }
  if (!dropped) return;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kept;
    TESSEL_CHECK(out.good(), "cannot rewrite metrics file '{}'", path);
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace tessel
