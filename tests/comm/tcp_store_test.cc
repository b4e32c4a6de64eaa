// TCP store: every op against a real server on 127.0.0.1, concurrency of add, blocking get
// and wait, timeouts that name their keys, tokens, a vanished server and malformed input; and
// the store under attack (TcpStoreAbuse): floods of strangers before authentication, unread
// replies, oversized values and the quota after it, with the store's memory read from the OS.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <sstream>
#include <thread>

#include "tessel/comm/tcp_store.h"
#include "tessel/core/error.h"

namespace tessel {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<TcpStoreServer> make_server(const std::string& token = "") {
  return std::make_unique<TcpStoreServer>(TcpStoreServer::Options{.host = "127.0.0.1", .port = 0, .token = token});
}

std::unique_ptr<TcpStore> connect(const TcpStoreServer& server, const std::string& token = "",
                                  Millis timeout = Millis(10'000)) {
  return std::make_unique<TcpStore>("127.0.0.1", server.port(), token, timeout);
}

// A port that was free a moment ago (bind 0, read it, close).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// A plain connected socket, for speaking bytes the client never would.
int raw_connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

std::string le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// Whether the server hung up on fd (recv sees EOF or a reset within 5 s).
bool server_closed(int fd) {
  char buf[256];
  while (true) {
    const ssize_t k = ::recv(fd, buf, sizeof buf, 0);
    if (k == 0) return true;
    if (k < 0) return errno == ECONNRESET;
  }
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(TcpStore, SetGetRoundTripsAnyBytes) {
  auto server = make_server();
  auto store = connect(*server);
  store->set("a", "1");
  store->set("empty", "");
  const std::string binary("x\0y\xff", 4);
  store->set("bin", binary);
  const std::string big(3 << 20, 'z');
  store->set("big", big);
  EXPECT_EQ(store->get("a", 1000ms), "1");
  EXPECT_EQ(store->get("empty", 1000ms), "");
  EXPECT_EQ(store->get("bin", 1000ms), binary);
  EXPECT_EQ(store->get("big", 1000ms), big);
  store->set("a", "2");
  EXPECT_EQ(store->get("a"), "2");
  // A second client sees the same data.
  auto other = connect(*server);
  EXPECT_EQ(other->get("a", 1000ms), "2");
}

TEST(TcpStore, AddIsExactUnderConcurrentThreadsAndClients) {
  auto server = make_server();
  constexpr int kThreads = 4, kAdds = 200;
  auto shared = connect(*server);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    // Half the threads have their own connection, half share one.
    threads.emplace_back([&, t] {
      std::unique_ptr<TcpStore> own = t % 2 == 0 ? connect(*server) : nullptr;
      Store& s = own ? *own : *shared;
      for (int i = 0; i < kAdds; ++i) s.add("counter", 1);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(shared->add("counter", 0), kThreads * kAdds);
  EXPECT_EQ(shared->get("counter", 1000ms), std::to_string(kThreads * kAdds));
  EXPECT_EQ(shared->add("neg", -5), -5);
  EXPECT_EQ(shared->add("neg", 2), -3);
}

TEST(TcpStore, AddOnANonIntegerFailsAndTheConnectionStaysUsable) {
  auto server = make_server();
  auto store = connect(*server);
  store->set("word", "hello");
  const std::string msg = error_of([&] { store->add("word", 1); });
  EXPECT_NE(msg.find("'word'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not an integer"), std::string::npos) << msg;
  EXPECT_EQ(store->add("n", 3), 3);
}

TEST(TcpStore, GetBlocksUntilAnotherClientSets) {
  auto server = make_server();
  auto reader = connect(*server);
  std::atomic<bool> set_done{false};
  std::thread writer([&] {
    auto w = connect(*server);
    std::this_thread::sleep_for(100ms);
    set_done = true;
    w->set("late", "here");
  });
  EXPECT_EQ(reader->get("late", 10'000ms), "here");
  EXPECT_TRUE(set_done.load());
  writer.join();
}

TEST(TcpStore, WaitReturnsOnceEveryKeyIsSetByOthers) {
  auto server = make_server();
  auto waiter = connect(*server);
  std::thread writer([&] {
    auto w = connect(*server);
    w->set("k1", "x");
    std::this_thread::sleep_for(50ms);
    w->add("k2", 1);
    std::this_thread::sleep_for(50ms);
    w->compare_set("k3", "", "y");
  });
  waiter->wait({"k1", "k2", "k3"}, 10'000ms);
  EXPECT_TRUE(waiter->check({"k1", "k2", "k3"}));
  writer.join();
  waiter->wait({}, 0ms);
}

TEST(TcpStore, ManyParkedWaitersAreReleasedByOneSet) {
  auto server = make_server();
  std::vector<std::future<std::string>> readers;
  for (int i = 0; i < 8; ++i)
    readers.push_back(std::async(std::launch::async, [&] { return connect(*server)->get("go", 10'000ms); }));
  std::this_thread::sleep_for(100ms);
  connect(*server)->set("go", "now");
  for (auto& r : readers) EXPECT_EQ(r.get(), "now");
}

TEST(TcpStore, GetAndWaitTimeOutNamingTheKeys) {
  auto server = make_server();
  auto store = connect(*server);
  std::string msg;
  try {
    store->get("never", 200ms);
    ADD_FAILURE() << "get did not time out";
  } catch (const TimeoutError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("'never'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("200 ms"), std::string::npos) << msg;

  store->set("present", "1");
  try {
    store->wait({"present", "absent"}, 200ms);
    ADD_FAILURE() << "wait did not time out";
  } catch (const TimeoutError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("missing ['absent']"), std::string::npos) << msg;
  EXPECT_NE(msg.find("200 ms"), std::string::npos) << msg;
  // A timeout is an answer, not a broken connection.
  EXPECT_EQ(store->get("present", 0ms), "1");
  EXPECT_THROW(store->get("never", 0ms), TimeoutError);
}

TEST(TcpStore, CompareSetFollowsTheStoreContract) {
  auto server = make_server();
  auto store = connect(*server);
  EXPECT_EQ(store->compare_set("k", "x", "y"), "");  // absent, expected not "": unchanged
  EXPECT_FALSE(store->check({"k"}));
  EXPECT_EQ(store->compare_set("k", "", "first"), "first");  // "" matches absent
  EXPECT_EQ(store->compare_set("k", "", "second"), "first");  // present: "" no longer matches
  EXPECT_EQ(store->compare_set("k", "wrong", "third"), "first");
  EXPECT_EQ(store->compare_set("k", "first", "third"), "third");
  EXPECT_EQ(store->get("k", 1000ms), "third");
}

TEST(TcpStore, RemoveAndCheck) {
  auto server = make_server();
  auto store = connect(*server);
  EXPECT_TRUE(store->check({}));
  EXPECT_FALSE(store->check({"a"}));
  store->set("a", "1");
  store->set("b", "2");
  EXPECT_TRUE(store->check({"a", "b"}));
  EXPECT_FALSE(store->check({"a", "c"}));
  EXPECT_TRUE(store->remove("a"));
  EXPECT_FALSE(store->remove("a"));
  EXPECT_FALSE(store->check({"a"}));
  EXPECT_TRUE(store->check({"b"}));
  EXPECT_THROW(store->get("a", 50ms), TimeoutError);
}

TEST(TcpStore, PrefixStoreWorksOverTcp) {
  auto server = make_server();
  std::shared_ptr<Store> base = connect(*server);
  PrefixStore job("job7", base);
  job.set("x", "1");
  EXPECT_EQ(base->get("job7/x", 1000ms), "1");
  EXPECT_EQ(job.add("n", 2), 2);
}

TEST(TcpStore, NonLoopbackServerRequiresAToken) {
  std::string msg;
  try {
    TcpStoreServer server({.host = "0.0.0.0", .port = 0, .token = ""});
    ADD_FAILURE() << "a server on 0.0.0.0 started without a token";
  } catch (const CommError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("token"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0.0.0.0"), std::string::npos) << msg;
}

TEST(TcpStore, TokenIsRequiredAndChecked) {
  auto server = make_server("s3cret");
  auto good = connect(*server, "s3cret");
  good->set("k", "v");
  for (const std::string bad : {"wrong", "", "s3cre", "s3cret!"}) {
    std::string msg;
    try {
      TcpStore store("127.0.0.1", server->port(), bad, 5000ms);
      ADD_FAILURE() << "token '" << bad << "' was accepted";
    } catch (const TimeoutError& e) {
      ADD_FAILURE() << "token '" << bad << "' timed out instead of being rejected: " << e.what();
    } catch (const CommError& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find("rejected"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(server->port())), std::string::npos) << msg;
  }
  // A raw client that skips HELLO is hung up on.
  int fd = raw_connect(server->port());
  const std::string frame = le32(10) + std::string("\x08", 1) + le32(1) + le32(1) + "k";  // CHECK ["k"]
  ASSERT_EQ(::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL), static_cast<ssize_t>(frame.size()));
  EXPECT_TRUE(server_closed(fd));
  ::close(fd);
  EXPECT_EQ(good->get("k", 1000ms), "v");
}

TEST(TcpStore, ClientOfAVanishedServerGetsCommErrorNotAHang) {
  auto server = make_server();
  const int port = server->port();
  auto idle = connect(*server);
  auto blocked = connect(*server);
  auto pending = std::async(std::launch::async, [&] { return error_of([&] { blocked->get("never", 60'000ms); }); });
  std::this_thread::sleep_for(100ms);
  server.reset();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(idle->set("k", "v"), CommError);
  // Later calls fail at once, naming the address.
  const std::string msg = error_of([&] { idle->check({"k"}); });
  EXPECT_NE(msg.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << msg;
  ASSERT_EQ(pending.wait_for(10s), std::future_status::ready) << "a blocked get hung after the server went away";
  EXPECT_NE(pending.get().find("127.0.0.1:" + std::to_string(port)), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  // Nothing listens there now: connecting gives up after its timeout.
  EXPECT_THROW(TcpStore("127.0.0.1", port, "", 200ms), CommError);
}

// A peer that accepts connections but never answers (a hung server) times the client out.
TEST(TcpStore, ASilentServerTimesTheClientOut) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 8), 0);  // the kernel completes handshakes; nobody ever replies
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(TcpStore("127.0.0.1", ntohs(a.sin_port), "", 200ms), TimeoutError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
  ::close(fd);
}

TEST(TcpStore, ClientRetriesUntilTheServerStarts) {
  const int port = free_port();
  std::unique_ptr<TcpStoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(300ms);
    server = std::make_unique<TcpStoreServer>(TcpStoreServer::Options{.host = "127.0.0.1", .port = port});
  });
  TcpStore store("127.0.0.1", port, "", 10'000ms);
  starter.join();
  store.set("k", "v");
  EXPECT_EQ(store.get("k", 1000ms), "v");
  EXPECT_EQ(server->port(), port);
}

TEST(TcpStore, PortZeroPicksDistinctFreePorts) {
  auto a = make_server();
  auto b = make_server();
  EXPECT_GT(a->port(), 0);
  EXPECT_GT(b->port(), 0);
  EXPECT_NE(a->port(), b->port());
  EXPECT_EQ(a->host(), "127.0.0.1");
  // A port in use cannot be bound twice; the error names the address.
  std::string msg = error_of([&] { TcpStoreServer clash({.host = "127.0.0.1", .port = a->port()}); });
  EXPECT_NE(msg.find(std::to_string(a->port())), std::string::npos) << msg;
}

TEST(TcpStore, MalformedFramesCloseOnlyThatClient) {
  auto server = make_server();
  auto good = connect(*server);
  good->set("k", "v");
  auto blocked = std::async(std::launch::async, [&] { return connect(*server)->get("later", 10'000ms); });
  const std::vector<std::string> garbage = {
      le32(0xffffffffu) + "xxxx",                                 // oversized
      le32(0),                                                    // empty body
      le32(1) + std::string("\x7f", 1),                           // unknown opcode
      le32(3) + std::string("\x02", 1) + "ab",                    // SET with truncated fields
      le32(6) + std::string("\x02", 1) + le32(100) + "k",         // string longer than the body
      le32(14) + std::string("\x02", 1) + le32(1) + "k" + le32(0) + "zzzz",  // trailing bytes
  };
  for (const std::string& g : garbage) {
    int fd = raw_connect(server->port());
    ASSERT_EQ(::send(fd, g.data(), g.size(), MSG_NOSIGNAL), static_cast<ssize_t>(g.size()));
    EXPECT_TRUE(server_closed(fd));
    ::close(fd);
  }
  // Half a frame, then a hang-up.
  int fd = raw_connect(server->port());
  const std::string half = le32(100) + "abc";
  ASSERT_EQ(::send(fd, half.data(), half.size(), MSG_NOSIGNAL), static_cast<ssize_t>(half.size()));
  ::close(fd);

  EXPECT_EQ(good->get("k", 1000ms), "v");
  good->set("later", "ok");
  EXPECT_EQ(blocked.get(), "ok");
  auto fresh = connect(*server);
  EXPECT_EQ(fresh->add("n", 1), 1);
}

// ---------------------------------------------------------------------------------------
// The store under attack.

const std::string kToken = "0123456789abcdef0123456789abcdef";  // 128 bits in hex

std::string le64(uint64_t v) { return le32(static_cast<uint32_t>(v)) + le32(static_cast<uint32_t>(v >> 32)); }
std::string wire_str(const std::string& s) { return le32(static_cast<uint32_t>(s.size())) + s; }
std::string frame(const std::string& body) { return le32(static_cast<uint32_t>(body.size())) + body; }
std::string hello_frame(const std::string& token) { return frame(std::string("\x01", 1) + wire_str(token)); }

void send_exactly(int fd, const std::string& bytes) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t k = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    ASSERT_GT(k, 0) << std::strerror(errno);
    sent += static_cast<std::size_t>(k);
  }
}

// Reads one reply frame's body (blocking, SO_RCVTIMEO applies); "" when the server hung up.
std::string read_reply(int fd) {
  auto read_n = [&](std::size_t n) {
    std::string out(n, '\0');
    std::size_t got = 0;
    while (got < n) {
      const ssize_t k = ::recv(fd, out.data() + got, n - got, 0);
      if (k <= 0) return std::string();
      got += static_cast<std::size_t>(k);
    }
    return out;
  };
  const std::string head = read_n(4);
  if (head.size() != 4) return "";
  const uint32_t len = static_cast<uint8_t>(head[0]) | static_cast<uint8_t>(head[1]) << 8 |
                       static_cast<uint8_t>(head[2]) << 16 | static_cast<uint32_t>(static_cast<uint8_t>(head[3])) << 24;
  return read_n(len);
}

// A non-blocking connect to 127.0.0.1:port, still in progress.
int start_connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  return fd;
}

// Waits (at most `limit`) until every connect in `fds` finished; returns how many succeeded.
int finish_connects(const std::vector<int>& fds, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  std::vector<pollfd> waiting;
  for (int fd : fds) waiting.push_back({fd, POLLOUT, 0});
  int ok = 0;
  while (!waiting.empty() && std::chrono::steady_clock::now() < until) {
    ::poll(waiting.data(), waiting.size(), 50);
    std::vector<pollfd> still;
    for (const pollfd& p : waiting) {
      if (p.revents == 0) {
        still.push_back({p.fd, POLLOUT, 0});
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err == 0) ++ok;
    }
    waiting = std::move(still);
  }
  return ok;
}

// A store server in a child process (tests/comm/store_host.cc), so its memory is the OS's
// figure for that process alone. Its log goes to a file.
class StoreHost {
 public:
  explicit StoreHost(std::vector<std::string> args) {
    log_path_ = (std::filesystem::temp_directory_path() / ("store-host-" + std::to_string(::getpid()) + "-" +
                                                          std::to_string(counter_++) + ".log"))
                    .string();
    args.insert(args.begin(), STORE_HOST);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) std::abort();
    pid_ = ::fork();
    if (pid_ == 0) {
      const int log = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      if (log >= 0) ::dup2(log, 2);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    std::string line;
    pollfd p{out[0], POLLIN, 0};
    while (line.find('\n') == std::string::npos && ::poll(&p, 1, 10'000) > 0) {
      char buf[64];
      const ssize_t k = ::read(out[0], buf, sizeof buf);
      if (k <= 0) break;
      line.append(buf, static_cast<std::size_t>(k));
    }
    ::close(out[0]);
    std::sscanf(line.c_str(), "port %d", &port_);
  }
  ~StoreHost() {
    ::close(stdin_);
    int status = 0;
    for (int i = 0; i < 500 && ::waitpid(pid_, &status, WNOHANG) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    std::filesystem::remove(log_path_);
  }
  int port() const { return port_; }
  // A field of /proc/<pid>/status in kB (VmRSS, VmHWM), -1 if absent.
  long status_kb(const std::string& field) const {
    std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
    for (std::string line; std::getline(f, line);)
      if (line.rfind(field + ":", 0) == 0) return std::atol(line.c_str() + field.size() + 1);
    return -1;
  }
  std::string log() const {
    std::ifstream f(log_path_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

 private:
  static inline int counter_ = 0;
  pid_t pid_ = -1;
  int stdin_ = -1;
  int port_ = 0;
  std::string log_path_;
};

// The acceptance test of the store's front door: eight strangers each announce a 64 MiB
// frame and push its bytes, then 2,000 connect and stay silent, against a store with the open-
// file limit of a launcher started from a shell (1024). The store's peak memory stays under
// 100 MB and a real rank still gets in within 2 s.
TEST(TcpStoreAbuse, AFloodOfStrangersNeitherBloatsTheStoreNorLocksARankOut) {
  constexpr int kIdle = 2000, kBig = 8;
  rlimit lim{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &lim), 0);
  const rlim_t need = kIdle + kBig + 64;
  if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < need)
    GTEST_SKIP() << "this test holds " << need << " sockets but the hard limit of open files is " << lim.rlim_max
                 << " (raise it with `ulimit -Hn`)";
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < need) {
    lim.rlim_cur = lim.rlim_max;
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &lim), 0) << std::strerror(errno);
  }
  StoreHost host({"--token", kToken, "--nofile", "1024"});
  ASSERT_GT(host.port(), 0) << host.log();
  const long rss_before = host.status_kb("VmRSS");

  // Eight strangers announce 64 MiB frames (no HELLO, no token) and push the bytes.
  std::vector<int> big;
  for (int i = 0; i < kBig; ++i) big.push_back(start_connect(host.port()));
  finish_connects(big, 5000ms);
  const std::string chunk(1 << 20, '\0');
  std::vector<std::size_t> sent(kBig, 0);
  std::vector<bool> done(kBig, false);
  for (int i = 0; i < kBig; ++i) {
    const std::string head = le32(64u << 20) + std::string("\x02", 1);  // a SET of 64 MiB
    done[i] = ::send(big[i], head.data(), head.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(head.size());
  }
  const auto pump_until = std::chrono::steady_clock::now() + 10s;
  std::size_t pushed = 0;
  while (std::chrono::steady_clock::now() < pump_until) {
    std::vector<pollfd> p;
    std::vector<int> who;
    for (int i = 0; i < kBig; ++i)
      if (!done[i]) {
        p.push_back({big[i], POLLOUT, 0});
        who.push_back(i);
      }
    if (p.empty()) break;
    ::poll(p.data(), p.size(), 50);
    for (std::size_t j = 0; j < p.size(); ++j) {
      if (p[j].revents == 0) continue;
      const int i = who[j];
      const ssize_t k = ::send(big[i], chunk.data(), std::min(chunk.size(), (64u << 20) - sent[i]),
                               MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k > 0) {
        sent[i] += static_cast<std::size_t>(k);
        pushed += static_cast<std::size_t>(k);
      }
      if ((k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) || sent[i] >= (64u << 20)) done[i] = true;
    }
  }

  // Two thousand strangers connect and say nothing.
  std::vector<int> idle;
  for (int i = 0; i < kIdle; ++i) idle.push_back(start_connect(host.port()));
  const int idle_connected = finish_connects(idle, 5000ms);

  // A real rank, with the token, while every stranger still holds its socket.
  const auto t0 = std::chrono::steady_clock::now();
  std::string rank_error;
  try {
    TcpStore rank("127.0.0.1", host.port(), kToken, 10'000ms);
    rank.set("rank/0", "here");
    EXPECT_EQ(rank.get("rank/0", 1000ms), "here");
  } catch (const Error& e) {
    rank_error = e.what();
  }
  const double rank_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const long hwm = host.status_kb("VmHWM"), rss_after = host.status_kb("VmRSS");
  std::cout << "[ measured ] store RSS " << rss_before / 1024.0 << " MB before, " << rss_after / 1024.0
            << " MB after, peak " << hwm / 1024.0 << " MB; strangers pushed " << pushed / 1048576.0
            << " MiB before being dropped; " << idle_connected << " of " << kIdle
            << " idle connections completed; a real rank connected and did set+get in " << rank_s << " s\n";
  EXPECT_EQ(rank_error, "");
  EXPECT_LT(rank_s, 2.0);
  EXPECT_GT(hwm, 0);
  EXPECT_LT(hwm, 100 * 1024) << "the store's peak memory (VmHWM) in kB";
  for (int fd : big) ::close(fd);
  for (int fd : idle) ::close(fd);
}

// After authentication: a client that pipelines GETs of a 1 MiB value and never reads the
// replies gets at most the reply queue's worth buffered (its further requests wait), and is
// dropped once it has read nothing for the stall timeout; the store says why in its log.
TEST(TcpStoreAbuse, PipelinedUnreadGetsHitTheReplyQueueLimit) {
  StoreHost host({"--token", kToken, "--stall-ms", "1000"});
  ASSERT_GT(host.port(), 0) << host.log();
  const int fd = raw_connect(host.port());
  send_exactly(fd, hello_frame(kToken));
  ASSERT_EQ(read_reply(fd), std::string("\x00", 1));
  const std::string value(1 << 20, 'v');
  send_exactly(fd, frame(std::string("\x02", 1) + wire_str("big") + wire_str(value)));
  ASSERT_EQ(read_reply(fd), std::string("\x00", 1));
  constexpr int kGets = 300;  // 300 MiB of replies if nothing held them back
  std::string gets;
  std::string get_body(1, '\x03');  // GET "big", no wait
  get_body += wire_str("big");
  get_body += le64(0);
  for (int i = 0; i < kGets; ++i) gets += frame(get_body);
  send_exactly(fd, gets);
  std::this_thread::sleep_for(2500ms);  // past the stall timeout
  const long hwm = host.status_kb("VmHWM");
  // Now read: the replies that were queued, then the hang-up.
  std::size_t replies = 0;
  bool hung_up = false;
  while (true) {
    const std::string r = read_reply(fd);
    if (r.empty()) {
      hung_up = errno != EAGAIN && errno != EWOULDBLOCK;  // EOF or reset, not the 5 s receive timeout
      break;
    }
    ++replies;
  }
  ::close(fd);
  std::cout << "[ measured ] store peak " << hwm / 1024.0 << " MB; " << replies << " of " << kGets
            << " pipelined 1 MiB GET replies delivered before the store dropped the client\n";
  EXPECT_LT(hwm, 100 * 1024) << "the store's peak memory (VmHWM) in kB";
  EXPECT_TRUE(hung_up) << "the store kept a client that read none of its replies";
  EXPECT_LT(replies, static_cast<std::size_t>(kGets));
  EXPECT_NE(host.log().find("read none of its"), std::string::npos) << host.log();
  // Everyone else is still served.
  TcpStore other("127.0.0.1", host.port(), kToken, 5000ms);
  EXPECT_EQ(other.get("big", 1000ms).size(), value.size());
}

// Issue 52, item 3: an authenticated client storing distinct 8 MiB values until refused (32 of
// them grew the launcher from 18 to 290 MB), then 64 more connections that each stall half-way
// through a 16 MiB SET. The store's peak memory stays under the documented 256 MiB (its data
// quota, 192 MiB, with the request buffers' budget, 48 MiB, and the process itself) and a real
// rank is still served at once.
TEST(TcpStoreAbuse, AnAuthenticatedHoarderStaysUnderTheStoresMemoryBound) {
  StoreHost host({"--token", kToken, "--stall-ms", "60000"});
  ASSERT_GT(host.port(), 0) << host.log();
  TcpStore hoarder("127.0.0.1", host.port(), kToken, 30'000ms);
  const std::string value(8u << 20, 'h');
  int stored = 0;
  std::string refusal;
  for (; stored < 64; ++stored) {
    refusal = error_of([&] { hoarder.set(fmt::format("hoard{}", stored), value); });
    if (refusal != "<no error>") break;
  }
  EXPECT_NE(refusal.find("over its quota of"), std::string::npos) << refusal;
  EXPECT_EQ(stored, 23) << "192 MiB of quota holds 23 values of 8 MiB (and their keys)";
  // Stalled large requests: each connection announces a 16 MiB SET and sends half of it.
  std::vector<int> stalled;
  const std::string half(8u << 20, 's');
  for (int i = 0; i < 64; ++i) {
    const int fd = raw_connect(host.port());
    send_exactly(fd, hello_frame(kToken));
    const std::string key = fmt::format("stall{}", i);
    // A SET frame: length, opcode, key, then the start of a 16 MiB value it never finishes.
    std::string head = le32(static_cast<uint32_t>(1 + 4 + key.size() + 4 + (16u << 20))) + std::string("\x02", 1) +
                       le32(static_cast<uint32_t>(key.size())) + key + le32(16u << 20);
    ::send(fd, head.data(), head.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::send(fd, half.data(), half.size(), MSG_NOSIGNAL | MSG_DONTWAIT);  // what the socket takes now
    stalled.push_back(fd);
  }
  std::this_thread::sleep_for(2s);  // the store reads what its budget allows
  const auto t0 = std::chrono::steady_clock::now();
  TcpStore rank("127.0.0.1", host.port(), kToken, 5000ms);
  rank.set("rank0/addr", "10.0.0.1:29500");
  EXPECT_EQ(rank.get("rank0/addr", 1000ms), "10.0.0.1:29500");
  EXPECT_EQ(rank.add("rank/count", 1), 1);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s) << "a rank waited for the hoarder";
  const long peak_kb = host.status_kb("VmHWM");
  std::printf("  store peak %.1f MiB after %d values of 8 MiB and 64 stalled 16 MiB requests\n", peak_kb / 1024.0, stored);
  EXPECT_LT(peak_kb, 256 * 1024) << "the store's peak memory is over its documented bound";
  for (int fd : stalled) ::close(fd);
}

// Oversized keys, values and requests, and the job's quota: an error naming the limit, and the
// connection stays usable.
TEST(TcpStoreAbuse, OversizedValuesAndTheQuotaAreRefusedWithAnError) {
  auto server = std::make_unique<TcpStoreServer>(
      TcpStoreServer::Options{.host = "127.0.0.1", .token = kToken, .quota_bytes = 8u << 20});
  auto store = connect(*server, kToken, 30'000ms);
  const std::size_t limit = TcpStoreServer::Options{}.max_value_bytes;
  std::string msg = error_of([&] { store->set("too-big", std::string(limit + 1, 'x')); });
  EXPECT_NE(msg.find("over the store's limit of " + std::to_string(limit) + " bytes"), std::string::npos) << msg;
  // Beyond a whole request's limit the body is discarded as it arrives, with the same answer.
  msg = error_of([&] { store->compare_set("k", "", std::string(limit + 1, 'd')); });
  EXPECT_NE(msg.find("over the store's limit of " + std::to_string(limit) + " bytes"), std::string::npos) << msg;
  msg = error_of([&] { store->set("too-big", std::string(2 * limit + 8192, 'x')); });
  EXPECT_NE(msg.find("a request of"), std::string::npos) << msg;
  msg = error_of([&] { store->set(std::string(5000, 'k'), "v"); });
  EXPECT_NE(msg.find("a key of 5000 bytes"), std::string::npos) << msg;
  store->set("fine", "v");
  EXPECT_EQ(store->get("fine", 1000ms), "v");
  // The quota: 8 MiB in all.
  const std::string mib(1 << 20, 'q');
  int stored = 0;
  for (; stored < 10; ++stored) {
    const std::string key = fmt::format("q{}", stored);
    msg = error_of([&] { store->set(key, mib); });
    if (msg != "<no error>") break;
  }
  EXPECT_EQ(stored, 7) << msg;
  EXPECT_NE(msg.find("over its quota of 8388608 bytes"), std::string::npos) << msg;
  EXPECT_TRUE(store->remove("q0"));
  store->set("q7", mib);  // room again
  EXPECT_EQ(store->get("q7", 1000ms), mib);
}

// Before HELLO: silence past the handshake deadline, or more than a handshake frame, is hung
// up on; after it, half a request that stops arriving is dropped after the stall timeout.
TEST(TcpStoreAbuse, SilentAndHalfSentConnectionsAreDropped) {
  auto server = std::make_unique<TcpStoreServer>(TcpStoreServer::Options{
      .host = "127.0.0.1", .token = kToken, .hello_timeout = 300ms, .stall_timeout = 300ms});
  const auto t0 = std::chrono::steady_clock::now();
  const int silent = raw_connect(server->port());
  EXPECT_TRUE(server_closed(silent));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  ::close(silent);

  const int half = raw_connect(server->port());
  send_exactly(half, hello_frame(kToken));
  ASSERT_EQ(read_reply(half), std::string("\x00", 1));
  const std::string part = le32(100) + std::string("\x02", 1) + "abc";
  send_exactly(half, part);
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_TRUE(server_closed(half));
  EXPECT_LT(std::chrono::steady_clock::now() - t1, 3s);
  ::close(half);

  const int greedy = raw_connect(server->port());  // a 2 KiB "handshake"
  send_exactly(greedy, frame(std::string("\x01", 1) + wire_str(std::string(2048, 't'))));
  EXPECT_TRUE(server_closed(greedy));
  ::close(greedy);
  EXPECT_THROW(TcpStore("127.0.0.1", server->port(), std::string(2048, 't'), 1000ms), Error);
  // A real client is not affected by any of it.
  auto store = connect(*server, kToken);
  store->set("k", "v");
  EXPECT_EQ(store->get("k", 1000ms), "v");
}

// At the limit of authenticated connections a newcomer is told "busy" and retries until its
// timeout; once a place frees up it gets in. Strangers beyond the pending limit push out the
// oldest stranger.
TEST(TcpStoreAbuse, ConnectionLimitsSayBusyAndDropTheOldestStranger) {
  auto server = std::make_unique<TcpStoreServer>(
      TcpStoreServer::Options{.host = "127.0.0.1", .token = kToken, .max_connections = 2, .max_pending = 4});
  auto a = connect(*server, kToken);
  auto b = connect(*server, kToken);
  std::string msg = error_of([&] { TcpStore("127.0.0.1", server->port(), kToken, 500ms); });
  EXPECT_NE(msg.find("busy"), std::string::npos) << msg;
  auto late = std::async(std::launch::async, [&] { return connect(*server, kToken, 10'000ms); });
  std::this_thread::sleep_for(200ms);
  a.reset();
  auto c = late.get();
  c->set("k", "v");
  EXPECT_EQ(b->get("k", 1000ms), "v");

  std::vector<int> strangers;
  for (int i = 0; i < 5; ++i) {
    strangers.push_back(raw_connect(server->port()));
    std::this_thread::sleep_for(50ms);
  }
  // The oldest made room for the fifth, long before the 5 s handshake deadline.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(read_reply(strangers[0]), std::string("\x04", 1));  // busy
  EXPECT_TRUE(server_closed(strangers[0]));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  for (int fd : strangers) ::close(fd);
}

// A store beyond loopback needs a token of 128 bits or more.
TEST(TcpStoreAbuse, AShortTokenIsRefusedBeyondLoopback) {
  for (const std::string token : {"", "t", "0123456789abcdef0123456789abcde"}) {
    std::string msg = error_of([&] { TcpStoreServer server({.host = "0.0.0.0", .port = 0, .token = token}); });
    EXPECT_NE(msg.find("at least 128 bits"), std::string::npos) << msg;
  }
  // On loopback any token (or none) will do: only local users can reach it.
  TcpStoreServer local({.host = "127.0.0.1", .port = 0, .token = "t"});
  EXPECT_GT(local.port(), 0);
}

}  // namespace
}  // namespace tessel
