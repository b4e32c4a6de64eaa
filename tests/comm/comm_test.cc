// The comm layer: the conformance suite on the thread backend (world sizes 1, 2, 3, 4, 8)
// and on Gloo ranks as threads of this process; failure injection (a rank that never joins,
// a rank that throws mid-collective) on both; hierarchical all_reduce across emulated nodes;
// statistics.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>

#include <atomic>
#include <chrono>
#include <cmath>
#include <iostream>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>
#include <thread>

#include "conformance.h"
#include "tessel/comm/gloo_backend.h"
#include "tessel/comm/heartbeat.h"
#include "tessel/comm/tcp_store.h"
#include "tessel/comm/thread_backend.h"
#include "tessel/comm/world.h"
#include "tessel/core/context.h"
#include "tessel/core/error.h"
#include "tessel/core/profile.h"
#include "tessel/core/thread_pool.h"

namespace tessel {
namespace {

using namespace std::chrono_literals;

// Gloo ranks as threads of this process over one in-memory store.
void spawn_gloo(int n, const std::function<void(ProcessGroup&)>& fn, Millis timeout = Millis(60'000),
                std::vector<int> nodes = {}, std::optional<GlooTransport> transport = std::nullopt) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::thread> threads;
  std::mutex m;
  std::exception_ptr first;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      auto ctx = make_rank_context(r, n, 1);
      RankContextScope scope(ctx);
      try {
        auto g = make_gloo_group(store, r, n, nodes, "127.0.0.1", timeout, "world", transport);
        fn(*g);
      } catch (...) {
        std::lock_guard lock(m);
        if (!first) first = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

// Thread ranks on emulated nodes: numbered node by node, in reverse node order, dealt round,
// three nodes, and uneven nodes (flat).
class ThreadConformanceOnNodes : public ::testing::TestWithParam<std::vector<int>> {};
TEST_P(ThreadConformanceOnNodes, PassesTheSuite) {
  SpawnOptions o;
  o.nodes = GetParam();
  spawn(static_cast<int>(o.nodes.size()), [](int) { testing::run_conformance(*world_group()); }, o);
}
INSTANTIATE_TEST_SUITE_P(Topologies, ThreadConformanceOnNodes,
                         ::testing::Values(std::vector<int>{0, 0, 1, 1}, std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1},
                                           std::vector<int>{1, 1, 0, 0}, std::vector<int>{0, 1, 0, 1, 0, 1},
                                           std::vector<int>{0, 0, 1, 1, 2, 2}, std::vector<int>{0, 0, 0, 1}));

class GlooThreadsConformanceOnNodes : public ::testing::TestWithParam<std::vector<int>> {};
TEST_P(GlooThreadsConformanceOnNodes, PassesTheSuite) {
  spawn_gloo(static_cast<int>(GetParam().size()), [](ProcessGroup& g) { testing::run_conformance(g); }, Millis(60'000),
             GetParam());
}
INSTANTIATE_TEST_SUITE_P(Topologies, GlooThreadsConformanceOnNodes,
                         ::testing::Values(std::vector<int>{0, 0, 1, 1}, std::vector<int>{0, 1, 0, 1}));

class ThreadConformance : public ::testing::TestWithParam<int> {};
TEST_P(ThreadConformance, PassesTheSuite) {
  spawn(GetParam(), [](int) { testing::run_conformance(*world_group()); });
}
INSTANTIATE_TEST_SUITE_P(WorldSizes, ThreadConformance, ::testing::Values(1, 2, 3, 4, 8));

// Ranks of one node: the collectives go through shared memory (comm/shm_collectives.h).
class GlooThreadsConformance : public ::testing::TestWithParam<int> {};
TEST_P(GlooThreadsConformance, PassesTheSuite) {
  spawn_gloo(GetParam(), [](ProcessGroup& g) {
    testing::run_conformance(g);
    EXPECT_EQ(gloo_transport_in_use(g), g.size() > 1 ? "shm" : "tcp") << "rank " << g.rank();
  });
}
INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooThreadsConformance, ::testing::Values(1, 2, 3, 4));

// The same over Gloo's TCP transport, as ranks on several machines use it.
class GlooThreadsTcpConformance : public ::testing::TestWithParam<int> {};
TEST_P(GlooThreadsTcpConformance, PassesTheSuite) {
  spawn_gloo(
      GetParam(),
      [](ProcessGroup& g) {
        testing::run_conformance(g);
        EXPECT_EQ(gloo_transport_in_use(g), "tcp") << "rank " << g.rank();
      },
      Millis(60'000), {}, GlooTransport::tcp);
}
INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooThreadsTcpConformance, ::testing::Values(2, 3));

// Sets an environment variable for a scope.
class EnvScope {
 public:
  EnvScope(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) before_ = v;
    ::setenv(name, value, 1);
  }
  ~EnvScope() {
    if (before_) ::setenv(name_, before_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> before_;
};

// Slots of 128 bytes: every collective of the suite (1001-element all_reduces, gathers of several
// windows) runs in many chunks, each behind its own barriers.
// Spawned thread ranks take their intra-op thread count from SpawnOptions, else from the
// environment (TESSEL_NUM_THREADS, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, in that order), else
// share the usable cores (issue 52: both variables were ignored and each rank took the cores).
TEST(ThreadBackendThreads, SpawnedRanksTakeTheEnvironmentsThreadCount) {
  std::map<std::string, std::optional<std::string>> saved;
  for (const char* name : {"TESSEL_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}) {
    const char* was = std::getenv(name);
    saved[name] = was != nullptr ? std::optional<std::string>(was) : std::nullopt;
    ::unsetenv(name);
  }
  auto threads_seen = [](int world, int per_rank) {
    std::vector<int> seen(static_cast<size_t>(world));
    spawn(world, [&](int rank) { seen[static_cast<size_t>(rank)] = current_num_threads(); },
          SpawnOptions{.threads_per_rank = per_rank});
    return seen;
  };
  // 3 is no machine's core count here: a rank that took the cores would not show it.
  ::setenv("OMP_NUM_THREADS", "3", 1);
  EXPECT_EQ(threads_seen(2, 0), (std::vector<int>{3, 3}));
  ::setenv("TESSEL_NUM_THREADS", "5", 1);
  EXPECT_EQ(threads_seen(1, 0), (std::vector<int>{5})) << "TESSEL_NUM_THREADS comes before OMP_NUM_THREADS";
  EXPECT_EQ(threads_seen(1, 2), (std::vector<int>{2})) << "an explicit count wins";
  ::unsetenv("TESSEL_NUM_THREADS");
  ::unsetenv("OMP_NUM_THREADS");
  EXPECT_EQ(threads_seen(1, 0), (std::vector<int>{usable_cores()}));
  EXPECT_EQ(threads_seen(2 * usable_cores(), 0), std::vector<int>(static_cast<size_t>(2 * usable_cores()), 1));
  for (const auto& [name, value] : saved) {
    if (value)
      ::setenv(name.c_str(), value->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
}

TEST(GlooSharedMemory, PassesTheSuiteInManySmallChunks) {
  EnvScope slot("TESSEL_GLOO_SHM_SLOT_BYTES", "128");
  spawn_gloo(3, [](ProcessGroup& g) {
    testing::run_conformance(g);
    EXPECT_EQ(gloo_transport_in_use(g), "shm");
  });
}

// The shared-memory path reduces in rank order as the thread backend does: the same bits for
// floats whose sum depends on the order (and Gloo's TCP ring agrees to rounding).
TEST(GlooSharedMemory, SumsInRankOrderLikeTheThreadBackend) {
  constexpr int P = 3;
  constexpr int64_t n = 100'003;
  auto input = [](int rank, int64_t i) {
    return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + rank) * std::pow(10.0, (i + rank) % 7 - 3));
  };
  auto run = [&](const std::function<void(const std::function<void(ProcessGroup&)>&)>& spawner) {
    std::vector<std::vector<float>> out(P);
    spawner([&](ProcessGroup& g) {
      std::vector<float> x(n);
      for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = input(g.rank(), i);
      g.all_reduce(x.data(), n, DType::f32, ReduceOp::sum);
      out[static_cast<size_t>(g.rank())] = std::move(x);
    });
    for (int r = 1; r < P; ++r) EXPECT_EQ(out[static_cast<size_t>(r)], out[0]) << "rank " << r;
    return out[0];
  };
  EnvScope slot("TESSEL_GLOO_SHM_SLOT_BYTES", "65536");
  const std::vector<float> shm = run([](const auto& f) { spawn_gloo(P, f); });
  const std::vector<float> threads = run([](const auto& f) { spawn(P, [&](int) { f(*world_group()); }); });
  const std::vector<float> tcp = run([](const auto& f) { spawn_gloo(P, f, Millis(60'000), {}, GlooTransport::tcp); });
  EXPECT_EQ(shm, threads);
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float a = shm[static_cast<size_t>(i)], b = tcp[static_cast<size_t>(i)];
    differ += a != b;
    float magnitude = 0;  // the sum's rounding scales with its terms, not with the sum
    for (int r = 0; r < P; ++r) magnitude += std::abs(input(r, i));
    ASSERT_NEAR(a, b, 1e-6f * magnitude) << "element " << i;
  }
  std::cout << "[ measured ] " << differ << " of " << n << " sums differ in the last bits between the rank-order and the ring order\n";
}

// Ranks as processes (comm_launched killed 2, started from this test, rendezvous over a TCP
// store it serves): rank 2 is killed outright (SIGKILL: no destructor says it left) between two
// collectives; the others, waiting for it at a shared-memory barrier with a 60 s timeout, see
// its process is gone and fail within seconds naming it (comm_launched checks the message).
TEST(GlooSharedMemory, AKilledRankProcessFailsTheOthersFastNamingIt) {
  TcpStoreServer server(TcpStoreServer::Options{});
  constexpr int P = 3, kKilled = 2;
  std::vector<pid_t> children;
  for (int r = 0; r < P; ++r) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid > 0) {
      children.push_back(pid);
      continue;
    }
    ::setenv("RANK", std::to_string(r).c_str(), 1);
    ::setenv("WORLD_SIZE", std::to_string(P).c_str(), 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", std::to_string(server.port()).c_str(), 1);
    ::unsetenv("TESSEL_GLOO_TRANSPORT");
    ::execl(COMM_LAUNCHED, COMM_LAUNCHED, "killed", std::to_string(kKilled).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  for (int r = 0; r < P; ++r) {
    int status = 0;
    ASSERT_EQ(::waitpid(children[static_cast<size_t>(r)], &status, 0), children[static_cast<size_t>(r)]);
    if (r == kKilled) {
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "rank " << r << " status " << status;
    } else {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r << " status " << status;
    }
  }
}

// all_to_all_v over shared memory in many rounds (192-byte slots: 8 doubles per pair and round),
// with uneven counts, zeros among them, against what each rank must receive.
TEST(GlooSharedMemory, AllToAllInManyRoundsWithUnevenCounts) {
  EnvScope slot("TESSEL_GLOO_SHM_SLOT_BYTES", "192");
  constexpr int P = 3;
  auto count = [](int src, int dst) { return static_cast<int64_t>((src * 37 + dst * 101) % 60); };
  auto value = [](int src, int dst, int64_t i) { return src * 1e6 + dst * 1e3 + static_cast<double>(i); };
  spawn_gloo(P, [&](ProcessGroup& g) {
    const int me = g.rank();
    std::vector<int64_t> sc(P), rc(P);
    std::vector<double> in;
    for (int d = 0; d < P; ++d) {
      sc[static_cast<size_t>(d)] = count(me, d);
      rc[static_cast<size_t>(d)] = count(d, me);
      for (int64_t i = 0; i < count(me, d); ++i) in.push_back(value(me, d, i));
    }
    std::vector<double> out(static_cast<size_t>(std::accumulate(rc.begin(), rc.end(), int64_t{0})), -1.0);
    g.all_to_all_v(in.data(), sc, out.data(), rc, DType::f64);
    size_t at = 0;
    for (int src = 0; src < P; ++src)
      for (int64_t i = 0; i < count(src, me); ++i, ++at)
        ASSERT_EQ(out[at], value(src, me, i)) << "rank " << me << " from " << src << " element " << i;
    EXPECT_EQ(gloo_transport_in_use(g), "shm");
  });
}

// A segment that cannot be made (here: slots of 1 TiB, more than /dev/shm holds, so reserving
// the pages fails at set-up) leaves every member on TCP, and the collectives still give the
// right answers.
TEST(GlooSharedMemory, ASegmentThatCannotBeMadeLeavesTheGroupOnTcp) {
  EnvScope slot("TESSEL_GLOO_SHM_SLOT_BYTES", "1099511627776");
  spawn_gloo(3, [](ProcessGroup& g) {
    std::vector<float> x(1000, static_cast<float>(g.rank() + 1));
    g.all_reduce(x.data(), static_cast<int64_t>(x.size()), DType::f32, ReduceOp::sum);
    EXPECT_EQ(x.front(), 6.0f);
    EXPECT_EQ(x.back(), 6.0f);
    EXPECT_EQ(gloo_transport_in_use(g), "tcp") << "rank " << g.rank();
  });
}

TEST(GlooSharedMemory, TheTransportVariableIsChecked) {
  EnvScope bad("TESSEL_GLOO_TRANSPORT", "infiniband");
  std::string msg;
  try {
    gloo_transport_from_env();
  } catch (const std::exception& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("TESSEL_GLOO_TRANSPORT='infiniband' must be auto or tcp"), std::string::npos) << msg;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(ThreadBackend, ARankThatNeverJoinsTimesOutNamingIt) {
  SpawnOptions o;
  o.timeout = 400ms;
  std::atomic<int> errors{0};
  std::string message;
  std::mutex m;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(spawn(3,
                     [&](int rank) {
                       if (rank == 2) {
                         std::this_thread::sleep_for(1500ms);  // never joins in time
                         return;
                       }
                       float x = 1;
                       try {
                         world_group()->all_reduce(&x, 1, DType::f32, ReduceOp::sum);
                       } catch (const CommError& e) {
                         ++errors;
                         std::lock_guard lock(m);
                         message = e.what();
                         throw;
                       }
                     },
                     o),
               CommError);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(errors.load(), 2);
  EXPECT_NE(message.find("[2]"), std::string::npos) << message;
  EXPECT_NE(message.find("all_reduce"), std::string::npos) << message;
  EXPECT_NE(message.find("'world'"), std::string::npos) << message;
  EXPECT_LT(secs, 3.0);
}

// The process-wide default timeout (tessel train --timeout, parallel.timeout_s, the launcher's
// TESSEL_TIMEOUT_S) reaches every group made without an explicit one.
TEST(DefaultTimeout, ReachesGroupsAndStoresMadeWithoutOne) {
  const Millis before = default_timeout();
  set_default_timeout(300ms);
  EXPECT_EQ(MemoryStore().timeout(), 300ms);
  std::string message;
  std::mutex m;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(spawn(2,
                     [&](int rank) {
                       if (rank == 1) return;  // never joins
                       float x = 1;
                       try {
                         world_group()->all_reduce(&x, 1, DType::f32, ReduceOp::sum);
                       } catch (const CommError& e) {
                         std::lock_guard lock(m);
                         message = e.what();
                         throw;
                       }
                     }),
               CommError);
  set_default_timeout(before);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_NE(message.find("300 ms"), std::string::npos) << message;
  EXPECT_THROW(set_default_timeout(0ms), Error);
  for (const char* bad : {"", "x", "0", "-2", "inf", "nan", "2e6", "5s"}) {
    std::string what;
    try {
      parse_timeout_seconds(bad, "TESSEL_TIMEOUT_S");
    } catch (const Error& e) {
      what = e.what();
    }
    EXPECT_NE(what.find("TESSEL_TIMEOUT_S"), std::string::npos) << "'" << bad << "' was accepted";
  }
  EXPECT_EQ(parse_timeout_seconds("2.5", "x"), 2500ms);
}

TEST(Heartbeat, TimingFollowsTheTimeout) {
  auto t = HeartbeatTiming::for_timeout(5s);
  EXPECT_EQ(t.silence, 2500ms);
  EXPECT_EQ(t.interval, 500ms);
  t = HeartbeatTiming::for_timeout(kDefaultTimeout);
  EXPECT_EQ(t.silence, 30s);
  EXPECT_EQ(t.interval, 1s);
  t = HeartbeatTiming::for_timeout(100ms);
  EXPECT_EQ(t.silence, 2s);
  EXPECT_EQ(t.interval, 400ms);
}

// A writer beats with its process's activity; the monitor reports a rank whose counter stops,
// with its last activity, and not one that exited.
TEST(Heartbeat, AWriterBeatsAndTheMonitorReportsSilence) {
  auto store = std::make_shared<MemoryStore>();
  HeartbeatMonitor monitor(300ms);
  {
    Activity step("step 7");
    Activity inner("all_reduce of 4 bytes");
    HeartbeatWriter writer(store, 3, 50ms);
    auto first = parse_heartbeat(store->get(heartbeat_key(3), 1000ms));
    ASSERT_TRUE(first.has_value());
    EXPECT_EQ(first->activity, "step 7 / all_reduce of 4 bytes");
    for (int i = 0; i < 8; ++i) {
      EXPECT_TRUE(monitor.poll(*store, {3, 4}).empty()) << "a beating rank (or one never seen) was reported";
      std::this_thread::sleep_for(60ms);
    }
    EXPECT_GT(monitor.last(3)->count, first->count);
  }
  EXPECT_EQ(parse_heartbeat(store->get(heartbeat_key(3), 1000ms))->activity, "exited");
  monitor.poll(*store, {3});
  std::this_thread::sleep_for(400ms);
  EXPECT_TRUE(monitor.poll(*store, {3}).empty()) << "an exited rank was reported";

  // A rank whose counter stops (a stopped process) is reported after the silence.
  store->set(heartbeat_key(5), "12 1500 group 'world' (rank 5 of 8) all_reduce (collective #9)");
  EXPECT_TRUE(monitor.poll(*store, {5}).empty());
  std::this_thread::sleep_for(350ms);
  auto silent = monitor.poll(*store, {5});
  ASSERT_EQ(silent.size(), 1u);
  EXPECT_EQ(silent[0].rank, 5);
  EXPECT_GE(silent[0].silent, 300ms);
  EXPECT_EQ(silent[0].last.describe(), "in group 'world' (rank 5 of 8) all_reduce (collective #9) for 1.5 s");
  EXPECT_FALSE(parse_heartbeat("garbage").has_value());
}

TEST(ThreadBackend, ARankThatThrowsStopsTheOthersAndItsErrorIsRethrown) {
  std::atomic<int> comm_errors{0};
  std::string msg = error_of([&] {
    spawn(4, [&](int rank) {
      if (rank == 1) throw std::runtime_error("rank 1 blew up in its forward");
      std::vector<float> x(100, 1.0f);
      try {
        world_group()->all_reduce(x.data(), 100, DType::f32, ReduceOp::sum);
      } catch (const CommError& e) {
        ++comm_errors;
        EXPECT_NE(std::string(e.what()).find("rank 1 failed"), std::string::npos) << e.what();
        throw;
      }
    });
  });
  EXPECT_EQ(msg, "rank 1 blew up in its forward");
  EXPECT_EQ(comm_errors.load(), 3);
}

TEST(ThreadBackend, MismatchedCollectivesAreNamed) {
  std::string msg = error_of([] {
    spawn(2, [](int rank) {
      float x[4] = {};
      if (rank == 0) world_group()->all_reduce(x, 4, DType::f32, ReduceOp::sum);
      else world_group()->broadcast(x, 4, DType::f32, 0);
    });
  });
  EXPECT_NE(msg.find("all_reduce"), std::string::npos) << msg;
  EXPECT_NE(msg.find("broadcast"), std::string::npos) << msg;
}

TEST(ThreadBackend, SendWithoutReceiverTimesOut) {
  SpawnOptions o;
  o.timeout = 200ms;
  std::string msg = error_of([&] {
    spawn(2,
          [](int rank) {
            int v = 1;
            if (rank == 0) world_group()->send(&v, 1, DType::i32, 1, 7);
          },
          o);
  });
  EXPECT_NE(msg.find("send"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tag 7"), std::string::npos) << msg;
}

// A rank blocked in recv sleeps until its sender comes: it must not poll, which on ranks that
// share cores takes the core from the sender. Over a 300 ms wait the receiving thread may be
// woken a few times, not thousands (polling every 20 us made about 4,000 voluntary switches).
TEST(ThreadBackend, ARankWaitingInRecvSleepsInsteadOfPolling) {
  long switches = -1;
  int got = 0;
  spawn(2, [&](int rank) {
    int v = 42;
    if (rank == 1) {
      std::this_thread::sleep_for(300ms);
      world_group()->send(&v, 1, DType::i32, 0, 3);
      return;
    }
    rusage before{}, after{};
    getrusage(RUSAGE_THREAD, &before);
    world_group()->recv(&got, 1, DType::i32, 1, 3);
    getrusage(RUSAGE_THREAD, &after);
    switches = after.ru_nvcsw - before.ru_nvcsw;
  });
  EXPECT_EQ(got, 42);
  EXPECT_GE(switches, 0);
  EXPECT_LT(switches, 50) << "voluntary context switches of the waiting rank";
}

TEST(ThreadBackend, StatsCountCallsAndBytes) {
  spawn(2, [](int) {
    auto g = world_group();
    g->reset_stats();
    std::vector<float> x(10), y(20);
    g->all_reduce(x.data(), 10, DType::f32, ReduceOp::sum);
    g->all_gather(x.data(), y.data(), 10, DType::f32);
    g->all_gather(x.data(), y.data(), 10, DType::f32);
    CommStats s = g->stats();
    EXPECT_EQ(s.ops.at("all_reduce").calls, 1);
    EXPECT_EQ(s.ops.at("all_reduce").bytes, 40);
    EXPECT_EQ(s.ops.at("all_gather").calls, 2);
    EXPECT_EQ(s.ops.at("all_gather").bytes, 80);
    EXPECT_EQ(s.total_calls(), 3);
  });
}

TEST(ThreadBackend, CollectivesAppearOnTheProfileByName) {
  profile_reset();
  set_profiling(true);
  spawn(2, [](int) {
    auto g = world_group();
    std::vector<float> x(10), y(20);
    g->all_reduce(x.data(), 10, DType::f32, ReduceOp::sum);
    g->all_gather(x.data(), y.data(), 10, DType::f32);
    g->all_gather(x.data(), y.data(), 10, DType::f32);
  });
  set_profiling(false);
  const std::string report = profile_report();
  profile_reset();
  // Two ranks: each collective is recorded once per rank.
  EXPECT_NE(report.find("(comm all_reduce)"), std::string::npos) << report;
  const size_t gathers = report.find("(comm all_gather)");
  ASSERT_NE(gathers, std::string::npos) << report;
  std::istringstream row(report.substr(gathers + std::string("(comm all_gather)").size()));
  double ms = 0;
  int64_t calls = 0;
  row >> ms >> calls;
  EXPECT_EQ(calls, 4) << report;
}

TEST(ThreadBackend, RanksGetTheirOwnContextsAndThreads) {
  std::atomic<int> sum{0};
  spawn(4, [&](int rank) {
    EXPECT_EQ(rank_context().rank, rank);
    EXPECT_EQ(rank_context().world_size, 4);
    EXPECT_EQ(world_group()->rank(), rank);
    sum += rank;
  });
  EXPECT_EQ(sum.load(), 6);
}

// Two emulated nodes of two ranks: all_reduce goes through reduce_scatter (node), all_reduce
// (across), all_gather (node) and equals the flat result.
TEST(Hierarchical, ChosenAcrossNodesAndExact) {
  SpawnOptions o;
  o.nodes = {0, 0, 1, 1};
  spawn(4,
        [](int rank) {
          auto g = world_group();
          EXPECT_TRUE(g->hierarchical());
          std::vector<int64_t> x(1001);
          for (size_t i = 0; i < x.size(); ++i) x[i] = rank * 1000 + static_cast<int64_t>(i);
          g->all_reduce(x.data(), 1001, DType::i64, ReduceOp::sum);
          for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], 6000 + 4 * static_cast<int64_t>(i));
          std::vector<double> y(10, rank);
          g->all_reduce(y.data(), 10, DType::f64, ReduceOp::avg);
          EXPECT_EQ(y[3], 1.5);
        },
        o);
  spawn(4, [](int) { EXPECT_FALSE(world_group()->hierarchical()); });
}

// The hierarchical all_to_all: asked for on one node it is refused naming the topology;
// TESSEL_ALL_TO_ALL=flat turns the automatic choice off, a bad value is named.
TEST(Hierarchical, AllToAllChoice) {
  spawn(2, [](int) {
    auto g = world_group();
    EXPECT_FALSE(g->all_to_all_hierarchical());
    try {
      g->set_all_to_all_algorithm(AllToAllAlgorithm::hierarchical);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("nodes are [0, 0]"), std::string::npos) << e.what();
    }
  });
  SpawnOptions o;
  o.nodes = {0, 0, 1, 1};
  ::setenv("TESSEL_ALL_TO_ALL", "flat", 1);
  spawn(4, [](int) {
    EXPECT_TRUE(world_group()->hierarchical());
    EXPECT_FALSE(world_group()->all_to_all_hierarchical());
  }, o);
  ::setenv("TESSEL_ALL_TO_ALL", "ring", 1);
  try {
    spawn(4, [](int) {}, o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TESSEL_ALL_TO_ALL: unknown all_to_all algorithm 'ring'"), std::string::npos)
        << e.what();
  }
  ::unsetenv("TESSEL_ALL_TO_ALL");
  spawn(4, [](int) { EXPECT_TRUE(world_group()->all_to_all_hierarchical()); }, o);
  EXPECT_EQ(parse_all_to_all_algorithm("hierarchical", "x"), AllToAllAlgorithm::hierarchical);
}

TEST(GlooThreads, HierarchicalAcrossEmulatedNodes) {
  spawn_gloo(
      4,
      [](ProcessGroup& g) {
        EXPECT_TRUE(g.hierarchical());
        std::vector<float> x(333);
        for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(g.rank() + i % 4);
        g.all_reduce(x.data(), 333, DType::f32, ReduceOp::sum);
        for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], static_cast<float>(6 + 4 * (i % 4)));
      },
      Millis(60'000), {0, 0, 1, 1});
}

TEST(GlooThreads, ARankThatNeverJoinsACollectiveTimesOutNamingIt) {
  std::atomic<int> errors{0};
  std::mutex m;
  std::string message;
  spawn_gloo(
      3,
      [&](ProcessGroup& g) {
        if (g.rank() == 1) {
          std::this_thread::sleep_for(2500ms);  // alive, but never calls the collective
          return;
        }
        float x = 1;
        try {
          g.all_reduce(&x, 1, DType::f32, ReduceOp::sum);
        } catch (const CommError& e) {
          ++errors;
          std::lock_guard lock(m);
          message = e.what();
        }
      },
      Millis(500));
  EXPECT_EQ(errors.load(), 2);
  EXPECT_NE(message.find("all_reduce"), std::string::npos) << message;
  EXPECT_NE(message.find("[1]"), std::string::npos) << message;
}

TEST(GlooThreads, ARankThatDiesMidCollectiveFailsTheOthersFast) {
  std::atomic<int> errors{0};
  auto t0 = std::chrono::steady_clock::now();
  std::string msg = error_of([&] {
    spawn_gloo(
        3,
        [&](ProcessGroup& g) {
          g.barrier();  // every rank has finished connecting
          if (g.rank() == 2) throw std::runtime_error("rank 2 died");  // its group (and sockets) go away
          std::vector<float> x(1 << 16, 1.0f);
          try {
            g.all_reduce(x.data(), 1 << 16, DType::f32, ReduceOp::sum);
            ADD_FAILURE() << "rank " << g.rank() << " completed the all_reduce without rank 2: x[0] = " << x[0];
          } catch (const CommError& e) {
            ++errors;
          } catch (const std::exception& e) {
            ADD_FAILURE() << "rank " << g.rank() << " got a non-CommError: " << e.what();
          }
        },
        Millis(20'000));
  });
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(msg, "rank 2 died");
  EXPECT_EQ(errors.load(), 2);
  EXPECT_LT(secs, 10.0);  // well before the 20 s timeout: the closed connections are noticed
}

TEST(GlooThreads, ARankThatNeverJoinsTheGroupTimesOut) {
  auto store = std::make_shared<MemoryStore>();
  std::string msg = error_of([&] { make_gloo_group(store, 0, 2, {}, "127.0.0.1", Millis(300)); });
  EXPECT_NE(msg.find("did not all join"), std::string::npos) << msg;
}

}  // namespace
}  // namespace tessel
