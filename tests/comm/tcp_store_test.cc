// TCP store: every op against a real server on 127.0.0.1, concurrency of add, blocking get
// and wait, timeouts that name their keys, tokens, a vanished server and malformed input.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
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

}  // namespace
}  // namespace tessel
