// Heartbeat writer, monitor and the process-wide activity stack they report.
#include "tessel/comm/heartbeat.h"

#include <algorithm>
#include <atomic>
#include <charconv>

#include "tessel/core/error.h"
#include "tessel/core/log.h"

namespace tessel {

namespace {

using Clock = std::chrono::steady_clock;

struct ActivityEntry {
  uint64_t id;
  std::string what;
  Clock::time_point since;
};

std::mutex g_activity_mutex;
std::vector<ActivityEntry> g_activities;  // outermost first
uint64_t g_next_activity = 1;

int64_t parse_i64(std::string_view s, bool* ok) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  *ok = *ok && ec == std::errc() && p == s.data() + s.size();
  return v;
}

}  // namespace

HeartbeatTiming HeartbeatTiming::for_timeout(Millis timeout) {
  const Millis silence = std::clamp(timeout / 2, Millis(2'000), Millis(30'000));
  return {std::clamp(silence / 5, Millis(100), Millis(1'000)), silence};
}

std::string heartbeat_key(int rank) { return fmt::format("heartbeat/rank/{}", rank); }

Activity::Activity(std::string what) {
  std::lock_guard lock(g_activity_mutex);
  id_ = g_next_activity++;
  g_activities.push_back({id_, std::move(what), Clock::now()});
}

Activity::~Activity() {
  std::lock_guard lock(g_activity_mutex);
  // Scopes of different threads may end out of order: remove this one wherever it is.
  auto it = std::find_if(g_activities.begin(), g_activities.end(), [&](const ActivityEntry& e) { return e.id == id_; });
  if (it != g_activities.end()) g_activities.erase(it);
}

std::pair<std::string, Millis> current_activity() {
  std::lock_guard lock(g_activity_mutex);
  if (g_activities.empty()) return {"", Millis(0)};
  std::string what;
  for (const ActivityEntry& e : g_activities) what += (what.empty() ? "" : " / ") + e.what;
  return {what, std::chrono::duration_cast<Millis>(Clock::now() - g_activities.back().since)};
}

HeartbeatWriter::HeartbeatWriter(std::shared_ptr<Store> store, int rank, Millis interval)
    : store_(std::move(store)), rank_(rank), interval_(interval) {
  TESSEL_CHECK(interval_.count() > 0, "heartbeat: the interval must be positive, got {} ms", interval_.count());
  beat(false);  // the first one before the constructor returns: the watcher sees the rank at once
  thread_ = std::thread([this] {
    std::unique_lock lock(mutex_);
    while (!stop_cv_.wait_for(lock, interval_, [&] { return stop_; })) {
      lock.unlock();
      beat(false);
      lock.lock();
      if (!store_) return;
    }
  });
}

HeartbeatWriter::~HeartbeatWriter() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  beat(true);
}

void HeartbeatWriter::beat(bool last) {
  if (!store_) return;
  auto [what, for_ms] = current_activity();
  if (last) what = "exited", for_ms = Millis(0);
  try {
    store_->set(heartbeat_key(rank_), fmt::format("{} {} {}", ++count_, for_ms.count(), what));
  } catch (const Error& e) {
    log_debug("heartbeat of rank {} stopped: {}", rank_, e.what());
    store_.reset();
  }
}

std::string Heartbeat::describe() const {
  if (activity == "exited") return "exited";
  if (activity.empty()) return "running, outside any collective";
  return fmt::format("in {} for {:.1f} s", activity, static_cast<double>(in_activity.count()) / 1000);
}

std::optional<Heartbeat> parse_heartbeat(const std::string& value) {
  const std::size_t a = value.find(' ');
  const std::size_t b = a == std::string::npos ? a : value.find(' ', a + 1);
  if (b == std::string::npos) return std::nullopt;
  bool ok = true;
  Heartbeat h;
  h.count = parse_i64(std::string_view(value).substr(0, a), &ok);
  h.in_activity = Millis(parse_i64(std::string_view(value).substr(a + 1, b - a - 1), &ok));
  h.activity = value.substr(b + 1);
  if (!ok) return std::nullopt;
  return h;
}

std::vector<HeartbeatMonitor::Silent> HeartbeatMonitor::poll(Store& store, const std::vector<int>& ranks) {
  std::vector<Silent> out;
  const auto now = Clock::now();
  for (int r : ranks) {
    const std::string key = heartbeat_key(r);
    if (!store.check({key})) continue;  // not started beating yet
    std::optional<Heartbeat> h = parse_heartbeat(store.get(key, Millis(1'000)));
    if (!h) continue;
    auto it = seen_.find(r);
    if (it == seen_.end() || it->second.beat.count != h->count) {
      seen_[r] = {*h, now};
      continue;
    }
    const Millis silent = std::chrono::duration_cast<Millis>(now - it->second.changed);
    if (h->activity != "exited" && silent >= silence_) out.push_back({r, silent, *h});
  }
  return out;
}

std::optional<Heartbeat> HeartbeatMonitor::last(int rank) const {
  auto it = seen_.find(rank);
  if (it == seen_.end()) return std::nullopt;
  return it->second.beat;
}

}  // namespace tessel
