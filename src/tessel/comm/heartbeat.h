// Heartbeats: each process rank proves through the job's store that it is alive and says what
// it is doing; a watcher (`tessel launch` today, an elastic agent later) notices one that goes
// silent — a stopped, frozen or unreachable process — within seconds, not at the next
// collective's timeout, and names it with its last activity.
//
// Protocol (keys in the job's store):
//   heartbeat/rank/<r>   "<count> <ms> <activity>": a counter bumped every interval, how long
//                        the rank has been in its current activity, and that activity
//                        ("group 'world' (rank 1 of 2) all_reduce (collective #7)"); the
//                        activity "exited" ends the rank's watch.
// A thread of the rank's process writes it with a store connection of its own, so a rank
// blocked in a store wait or a collective still beats. Silence is judged on the watcher's
// clock, by the counter not changing, so the clocks of different machines never meet.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tessel/comm/store.h"

namespace tessel {

struct HeartbeatTiming {
  Millis interval;  // how often a rank beats
  Millis silence;   // a rank silent this long is reported
  // From the job's timeout: silence = timeout / 2 within [2 s, 30 s] (so a silent rank is
  // caught before the collectives waiting on it time out), interval = silence / 5 within
  // [100 ms, 1 s].
  static HeartbeatTiming for_timeout(Millis timeout);
};

std::string heartbeat_key(int rank);

// Marks what this process is doing while it lives (nested scopes read "outer / inner"); read
// by the heartbeat. Process-wide: under `tessel launch` a process is one rank.
class Activity {
 public:
  explicit Activity(std::string what);
  ~Activity();
  Activity(const Activity&) = delete;
  Activity& operator=(const Activity&) = delete;

 private:
  uint64_t id_;
};
// The current activity ("" when none) and how long it has lasted.
std::pair<std::string, Millis> current_activity();

// Beats for `rank` every `interval` on `store` (which it owns alone) until destroyed; the last
// beat says "exited". Gives up quietly when the store goes away (the watcher is gone too).
class HeartbeatWriter {
 public:
  HeartbeatWriter(std::shared_ptr<Store> store, int rank, Millis interval);
  ~HeartbeatWriter();
  HeartbeatWriter(const HeartbeatWriter&) = delete;
  HeartbeatWriter& operator=(const HeartbeatWriter&) = delete;

 private:
  void beat(bool last);
  std::shared_ptr<Store> store_;
  int rank_;
  Millis interval_;
  int64_t count_ = 0;
  std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread thread_;
};

struct Heartbeat {
  int64_t count = 0;
  Millis in_activity{0};
  std::string activity;
  // "in ACTIVITY for S s" / "running, outside any marked activity" / "exited".
  std::string describe() const;
};
// Parses a heartbeat value; nullopt when malformed.
std::optional<Heartbeat> parse_heartbeat(const std::string& value);

// Watches ranks' heartbeats on the watcher's clock.
class HeartbeatMonitor {
 public:
  explicit HeartbeatMonitor(Millis silence) : silence_(silence) {}
  struct Silent {
    int rank;
    Millis silent;   // since the counter last changed
    Heartbeat last;  // the last heartbeat seen
  };
  // Reads the heartbeat of every rank in `ranks`; returns those that have beaten at least once
  // and then kept the same counter for `silence` or more (ranks whose last beat says "exited"
  // are not reported). Store errors propagate.
  std::vector<Silent> poll(Store& store, const std::vector<int>& ranks);
  // The last heartbeat seen from `rank`, if any.
  std::optional<Heartbeat> last(int rank) const;
  Millis silence() const { return silence_; }

 private:
  struct Seen {
    Heartbeat beat;
    std::chrono::steady_clock::time_point changed;
  };
  Millis silence_;
  std::map<int, Seen> seen_;
};

}  // namespace tessel
