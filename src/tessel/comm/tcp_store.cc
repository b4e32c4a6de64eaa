// The TCP store: a single-threaded poll() server and a mutex-serialised client.
//
// Requests (opcode, then fields):
//   HELLO token | SET key value | GET key timeout_ms | ADD key delta | WAIT n keys... timeout_ms
//   COMPARE_SET key expected desired | DELETE key | CHECK n keys...
// Replies (status, then fields):
//   ok      HELLO/SET/WAIT: nothing; GET/COMPARE_SET: value; ADD: i64; DELETE/CHECK: u8
//   timeout n keys...  (the keys still missing when the deadline passed)
//   error   message    (e.g. ADD on a value that is not an integer)
//   rejected           (bad token; the server then closes the connection)
// The server keeps at most one request per client in flight: a parked GET/WAIT holds back
// that client's later frames, so replies always come in request order.
#include "tessel/comm/tcp_store.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <list>
#include <map>
#include <mutex>

#include "tessel/comm/socket.h"
#include "tessel/core/error.h"
#include "tessel/core/log.h"

namespace tessel {

namespace {

using net::Clock;
using net::Deadline;
using net::WireReader;
using net::WireWriter;

constexpr uint32_t kMaxMessage = 64u << 20;       // largest message body either side accepts
constexpr Millis kMaxTick{1000};                  // longest poll() sleep while requests are parked
constexpr Millis kReplyGrace{2000};               // client waits this much past a blocking call's timeout
constexpr Millis kMinHelloTimeout{2000};

enum class Op : uint8_t { hello = 1, set, get, add, wait, compare_set, remove, check };
enum class Status : uint8_t { ok = 0, timeout, error, rejected };

std::string join(const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& k : keys) out += (out.empty() ? "'" : ", '") + k + "'";
  return out;
}

// Compares without an early exit, so response timing does not reveal how much of a guessed
// token was right.
bool equal_constant_time(const std::string& a, const std::string& b) {
  const std::size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

// How long a client waits for the reply to a blocking call: the server answers at `timeout`,
// the grace covers the trip; saturates for "forever".
Millis reply_wait(Millis timeout) {
  timeout = std::max(timeout, Millis(0));
  return timeout > Millis::max() - kReplyGrace ? Millis::max() : timeout + kReplyGrace;
}

std::string reply_ok() { return WireWriter().u8(static_cast<uint8_t>(Status::ok)).frame(); }
std::string reply_error(const std::string& message) {
  return WireWriter().u8(static_cast<uint8_t>(Status::error)).str(message).frame();
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Server

struct TcpStoreServer::Impl {
  struct Client {
    net::Fd fd;
    std::string in;     // bytes received, not yet parsed
    std::string out;    // bytes to send
    bool authed = false;
    bool parked = false;
    bool closing = false;
  };
  struct Parked {
    uint64_t client;
    Op op;
    std::vector<std::string> keys;
    Deadline deadline;
  };

  Options options;
  int port = 0;
  net::Fd listener;
  net::Fd stop_read, stop_write;
  std::thread thread;

  // Owned by the server thread once it runs.
  std::map<uint64_t, Client> clients;
  std::list<Parked> parked;
  std::map<std::string, std::string> data;
  uint64_t next_id = 1;

  void run();
  void serve();
  void accept_clients();
  void read_client(Client& c);
  bool process_frames(uint64_t id, Client& c);
  void handle(uint64_t id, Client& c, std::string_view body);
  bool release_parked();
  void flush(Client& c);
  bool has(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data.count(k) > 0; });
  }
};

TcpStoreServer::TcpStoreServer(Options options) : impl_(std::make_unique<Impl>()) {
  // The token is checked before anything is bound: an open port without one would let any
  // host on the network write into the job's rendezvous.
  TESSEL_CHECK_AS(CommError, !options.token.empty() || net::is_loopback_host(options.host),
                  "store server: listening on {} (not a loopback address) requires a job token; pass --token or set "
                  "TESSEL_JOB_TOKEN, or listen on 127.0.0.1",
                  net::host_port(options.host, options.port));
  impl_->options = std::move(options);
  impl_->listener = net::listen_tcp(impl_->options.host, impl_->options.port, &impl_->port);
  auto [r, w] = net::make_pipe();
  impl_->stop_read = std::move(r);
  impl_->stop_write = std::move(w);
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

TcpStoreServer::~TcpStoreServer() {
  const char byte = 1;
  while (::write(impl_->stop_write.get(), &byte, 1) < 0 && errno == EINTR) {
  }
  if (impl_->thread.joinable()) impl_->thread.join();
}

const std::string& TcpStoreServer::host() const { return impl_->options.host; }
int TcpStoreServer::port() const { return impl_->port; }

void TcpStoreServer::Impl::run() {
  try {
    serve();
  } catch (const std::exception& e) {
    log_error("store server on {} stopped: {}", net::host_port(options.host, port), e.what());
  }
  clients.clear();
  parked.clear();
}

void TcpStoreServer::Impl::serve() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  while (true) {
    fds.clear();
    ids.clear();
    fds.push_back({stop_read.get(), POLLIN, 0});
    fds.push_back({listener.get(), POLLIN, 0});
    for (auto& [id, c] : clients) {
      fds.push_back({c.fd.get(), static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      ids.push_back(id);
    }
    int timeout_ms = -1;
    if (!parked.empty()) {
      Deadline first = Deadline::max();
      for (const Parked& p : parked) first = std::min(first, p.deadline);
      timeout_ms = static_cast<int>(std::min(net::time_left(first), kMaxTick).count());
    }
    const int r = ::poll(fds.data(), fds.size(), timeout_ms);
    if (r < 0) {
      TESSEL_CHECK_AS(CommError, errno == EINTR, "poll failed: {}", std::strerror(errno));
      continue;
    }
    if (fds[0].revents != 0) return;  // stop requested
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const short ev = fds[i + 2].revents;
      auto it = clients.find(ids[i]);
      if (ev == 0 || it == clients.end()) continue;
      if (ev & (POLLIN | POLLHUP | POLLERR)) read_client(it->second);
      if ((ev & POLLOUT) && !it->second.closing) flush(it->second);
    }
    if (fds[1].revents & POLLIN) accept_clients();

    // Run every complete frame; a change of data may release parked requests, whose clients
    // may then have further frames: repeat until nothing moves.
    bool progress = true;
    while (progress) {
      progress = false;
      for (auto& [id, c] : clients)
        if (!c.closing && !c.parked && process_frames(id, c)) progress = true;
      if (release_parked()) progress = true;
    }
    for (auto it = clients.begin(); it != clients.end();) {
      Client& c = it->second;
      if (!c.closing && !c.out.empty()) flush(c);
      if (c.closing) {
        parked.remove_if([id = it->first](const Parked& p) { return p.client == id; });
        it = clients.erase(it);
      } else {
        ++it;
      }
    }
  }
}

void TcpStoreServer::Impl::accept_clients() {
  while (true) {
    const int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        // Out of descriptors: leave the connection queued rather than spin on it.
        log_warn("store server: cannot accept a connection: {}", std::strerror(errno));
        ::usleep(10'000);
      }
      return;
    }
    Client c;
    c.fd = net::Fd(fd);
    c.authed = options.token.empty();
    clients.emplace(next_id++, std::move(c));
  }
}

void TcpStoreServer::Impl::read_client(Client& c) {
  char buf[65536];
  while (!c.closing) {
    const ssize_t k = ::recv(c.fd.get(), buf, sizeof buf, 0);
    if (k > 0) {
      c.in.append(buf, static_cast<std::size_t>(k));
      // A well-behaved client has at most one request in flight; anything far beyond one
      // maximal message is a flood.
      if (c.in.size() > 2 * static_cast<std::size_t>(kMaxMessage)) c.closing = true;
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    c.closing = true;  // EOF or error
  }
}

bool TcpStoreServer::Impl::process_frames(uint64_t id, Client& c) {
  std::size_t pos = 0;
  bool any = false;
  while (!c.closing && !c.parked && c.in.size() - pos >= 4) {
    const uint32_t len = net::decode_u32(c.in.data() + pos);
    if (len == 0 || len > kMaxMessage) {
      c.closing = true;
      break;
    }
    if (c.in.size() - pos - 4 < len) break;
    try {
      handle(id, c, std::string_view(c.in).substr(pos + 4, len));
    } catch (const Error&) {
      c.closing = true;  // malformed: drop this client, keep serving the others
    }
    pos += 4 + len;
    any = true;
  }
  if (pos > 0) c.in.erase(0, pos);
  return any;
}

void TcpStoreServer::Impl::handle(uint64_t id, Client& c, std::string_view body) {
  WireReader r(body);
  const auto op = static_cast<Op>(r.u8());
  if (!c.authed) {
    bool ok = false;
    if (op == Op::hello) {
      const std::string token = r.str();
      r.expect_end();
      ok = equal_constant_time(token, options.token);
    }
    if (!ok) {
      // Best effort: tell the client why, then hang up.
      const std::string frame = WireWriter().u8(static_cast<uint8_t>(Status::rejected)).frame();
      (void)::send(c.fd.get(), frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      c.closing = true;
      return;
    }
    c.authed = true;
    c.out += reply_ok();
    return;
  }
  switch (op) {
    case Op::hello: {
      r.str();
      r.expect_end();
      c.out += reply_ok();
      return;
    }
    case Op::set: {
      std::string key = r.str();
      std::string value = r.str();
      r.expect_end();
      data[std::move(key)] = std::move(value);
      c.out += reply_ok();
      return;
    }
    case Op::get:
    case Op::wait: {
      std::vector<std::string> keys;
      if (op == Op::get) {
        keys.push_back(r.str());
      } else {
        const uint32_t n = r.u32();
        for (uint32_t i = 0; i < n; ++i) keys.push_back(r.str());
      }
      const int64_t timeout_ms = r.i64();
      r.expect_end();
      parked.push_back({id, op, std::move(keys), net::deadline_after(Millis(timeout_ms))});
      c.parked = true;
      release_parked();  // answers at once when the keys exist or the timeout is zero
      return;
    }
    case Op::add: {
      const std::string key = r.str();
      const int64_t delta = r.i64();
      r.expect_end();
      int64_t v = 0;
      auto it = data.find(key);
      if (it != data.end()) {
        const std::string& s = it->second;
        auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec != std::errc() || p != s.data() + s.size()) {
          c.out += reply_error(fmt::format("store add: key '{}' holds '{}', not an integer", key, s));
          return;
        }
      }
      if (__builtin_add_overflow(v, delta, &v)) {
        c.out += reply_error(fmt::format("store add: key '{}' would overflow a 64-bit integer", key));
        return;
      }
      data[key] = std::to_string(v);
      c.out += WireWriter().u8(static_cast<uint8_t>(Status::ok)).i64(v).frame();
      return;
    }
    case Op::compare_set: {
      const std::string key = r.str();
      const std::string expected = r.str();
      std::string desired = r.str();
      r.expect_end();
      auto it = data.find(key);
      std::string result;
      if ((it == data.end() && expected.empty()) || (it != data.end() && it->second == expected)) {
        data[key] = desired;
        result = std::move(desired);
      } else if (it != data.end()) {
        result = it->second;
      }
      c.out += WireWriter().u8(static_cast<uint8_t>(Status::ok)).str(result).frame();
      return;
    }
    case Op::remove: {
      const std::string key = r.str();
      r.expect_end();
      const bool existed = data.erase(key) > 0;
      c.out += WireWriter().u8(static_cast<uint8_t>(Status::ok)).u8(existed ? 1 : 0).frame();
      return;
    }
    case Op::check: {
      const uint32_t n = r.u32();
      std::vector<std::string> keys;
      for (uint32_t i = 0; i < n; ++i) keys.push_back(r.str());
      r.expect_end();
      c.out += WireWriter().u8(static_cast<uint8_t>(Status::ok)).u8(has(keys) ? 1 : 0).frame();
      return;
    }
  }
  TESSEL_CHECK_AS(CommError, false, "malformed store message: unknown opcode {}", static_cast<int>(op));
}

bool TcpStoreServer::Impl::release_parked() {
  bool released = false;
  const Deadline now = Clock::now();
  for (auto it = parked.begin(); it != parked.end();) {
    auto cit = clients.find(it->client);
    if (cit == clients.end() || cit->second.closing) {
      it = parked.erase(it);
      continue;
    }
    Client& c = cit->second;
    if (has(it->keys)) {
      if (it->op == Op::get)
        c.out += WireWriter().u8(static_cast<uint8_t>(Status::ok)).str(data.at(it->keys[0])).frame();
      else
        c.out += reply_ok();
    } else if (now >= it->deadline) {
      WireWriter w;
      w.u8(static_cast<uint8_t>(Status::timeout));
      std::vector<std::string> missing;
      for (const std::string& k : it->keys)
        if (!data.count(k)) missing.push_back(k);
      w.u32(static_cast<uint32_t>(missing.size()));
      for (const std::string& k : missing) w.str(k);
      c.out += w.frame();
    } else {
      ++it;
      continue;
    }
    c.parked = false;
    released = true;
    it = parked.erase(it);
  }
  return released;
}

void TcpStoreServer::Impl::flush(Client& c) {
  std::size_t sent = 0;
  while (sent < c.out.size()) {
    const ssize_t k = ::send(c.fd.get(), c.out.data() + sent, c.out.size() - sent, MSG_NOSIGNAL);
    if (k > 0) {
      sent += static_cast<std::size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;  // poll for POLLOUT
    c.closing = true;
    break;
  }
  c.out.erase(0, sent);
}

std::string TcpStoreServer::serve_bytes(std::string_view bytes, const std::string& token) {
  Impl impl;
  impl.options.token = token;
  const uint64_t id = impl.next_id++;
  Impl::Client& c = impl.clients[id];
  c.authed = token.empty();
  c.in.assign(bytes);
  while (!c.closing && !c.parked && impl.process_frames(id, c)) impl.release_parked();
  return c.out;
}

// ---------------------------------------------------------------------------------------
// Client

struct TcpStore::Impl {
  std::string where;  // host:port, for messages
  std::mutex mutex;
  net::Fd fd;
  std::string lost;  // why the connection is unusable, once it is

  // Sends one request and returns the reply body; the connection is dropped (and later
  // calls fail at once) when the reply does not arrive in time or the server hangs up.
  std::string call(const WireWriter& request, Deadline deadline, Millis waited, const std::string& what);
  // The reply of a request that either succeeds or fails with an error message.
  WireReader expect_ok(const std::string& reply, const std::string& what);
};

std::string TcpStore::Impl::call(const WireWriter& request, Deadline deadline, Millis waited, const std::string& what) {
  TESSEL_CHECK(request.size() <= kMaxMessage, "store {}: {} is {} bytes, over the store's limit of {} bytes", where,
               what, request.size(), kMaxMessage);
  TESSEL_CHECK_AS(CommError, static_cast<bool>(fd), "store {}: cannot {}: the connection was lost earlier ({})", where,
                  what, lost);
  auto fail = [&](net::Io io, int err, const char* during) {
    fd.reset();
    if (io == net::Io::timeout) {
      lost = fmt::format("no reply to {} within {} ms", what, waited.count());
      TESSEL_CHECK_AS(TimeoutError, false, "store {}: no reply to {} within {} ms; is the store's process alive?",
                      where, what, waited.count());
    }
    lost = io == net::Io::closed ? std::string("the server closed the connection")
                                 : fmt::format("{} failed: {}", during, std::strerror(err));
    TESSEL_CHECK_AS(CommError, false, "store {}: {} failed: {} (has the store's process exited?)", where, what, lost);
  };
  const std::string frame = request.frame();
  int err = 0;
  net::Io io = net::send_all(fd.get(), frame.data(), frame.size(), deadline, &err);
  if (io != net::Io::ok) fail(io, err, "send");
  char header[4];
  io = net::recv_all(fd.get(), header, 4, deadline, &err);
  if (io != net::Io::ok) fail(io, err, "receive");
  const uint32_t len = net::decode_u32(header);
  if (len == 0 || len > kMaxMessage + 64) {
    fd.reset();
    lost = fmt::format("a reply announced {} bytes", len);
    TESSEL_CHECK_AS(CommError, false, "store {}: {} failed: malformed reply of {} bytes (is this a tessel store?)",
                    where, what, len);
  }
  std::string body(len, '\0');
  io = net::recv_all(fd.get(), body.data(), len, deadline, &err);
  if (io != net::Io::ok) fail(io, err, "receive");
  return body;
}

WireReader TcpStore::Impl::expect_ok(const std::string& reply, const std::string& what) {
  WireReader r(reply);
  const auto status = static_cast<Status>(r.u8());
  if (status == Status::error) TESSEL_THROW("{}", r.str());
  TESSEL_CHECK_AS(CommError, status == Status::ok, "store {}: unexpected reply status {} to {}", where,
                  static_cast<int>(status), what);
  return r;
}

TcpStore::TcpStore(const std::string& host, int port, const std::string& token, Millis timeout)
    : impl_(std::make_unique<Impl>()) {
  timeout_ = timeout;
  impl_->where = net::host_port(host, port);
  TESSEL_CHECK(port > 0 && port <= 65535, "store: cannot connect to {}: port must be in 1..65535", impl_->where);
  const Deadline deadline = net::deadline_after(timeout);
  Millis backoff{10};
  std::string why;
  while (true) {
    impl_->fd = net::try_connect_tcp(host, port, deadline, &why);
    if (impl_->fd) break;
    TESSEL_CHECK_AS(TimeoutError, Clock::now() < deadline,
                    "store: could not connect to {} within {} ms: {} (is the store's server, e.g. node 0's launcher, "
                    "running?)",
                    impl_->where, timeout.count(), why);
    std::this_thread::sleep_for(std::min(backoff, net::time_left(deadline)));
    backoff = std::min(backoff * 2, Millis(200));
  }
  const Millis hello_wait = std::max(net::time_left(deadline), kMinHelloTimeout);
  std::string reply;
  try {
    reply = impl_->call(WireWriter().u8(static_cast<uint8_t>(Op::hello)).str(token), net::deadline_after(hello_wait),
                        hello_wait, "hello");
  } catch (const TimeoutError&) {
    throw;
  } catch (const CommError&) {
    reply.clear();  // the server hung up: that is how it rejects a token
  }
  WireReader r(reply);
  const bool ok = !reply.empty() && static_cast<Status>(r.u8()) == Status::ok;
  TESSEL_CHECK_AS(CommError, ok,
                  "store {}: the server rejected this client's job token ({}); every launcher and rank of a job must "
                  "use the same --token / TESSEL_JOB_TOKEN",
                  impl_->where, token.empty() ? "none given" : "token given");
}

TcpStore::~TcpStore() = default;

void TcpStore::set(const std::string& key, const std::string& value) {
  std::lock_guard lock(impl_->mutex);
  const std::string what = fmt::format("set of key '{}'", key);
  std::string reply = impl_->call(WireWriter().u8(static_cast<uint8_t>(Op::set)).str(key).str(value),
                                  net::deadline_after(timeout_), timeout_, what);
  impl_->expect_ok(reply, what).expect_end();
}

std::string TcpStore::get(const std::string& key, Millis timeout) {
  std::lock_guard lock(impl_->mutex);
  const std::string what = fmt::format("get of key '{}'", key);
  const Millis waited = reply_wait(timeout);
  std::string reply =
      impl_->call(WireWriter().u8(static_cast<uint8_t>(Op::get)).str(key).i64(std::max<int64_t>(timeout.count(), 0)),
                  net::deadline_after(waited), waited, what);
  WireReader r(reply);
  if (static_cast<Status>(reply[0]) == Status::timeout)
    TESSEL_CHECK_AS(TimeoutError, false, "store {}: timed out after {} ms waiting for key '{}'", impl_->where,
                    timeout.count(), key);
  r = impl_->expect_ok(reply, what);
  std::string value = r.str();
  r.expect_end();
  return value;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::lock_guard lock(impl_->mutex);
  const std::string what = fmt::format("add to key '{}'", key);
  std::string reply = impl_->call(WireWriter().u8(static_cast<uint8_t>(Op::add)).str(key).i64(delta),
                                  net::deadline_after(timeout_), timeout_, what);
  WireReader r = impl_->expect_ok(reply, what);
  const int64_t v = r.i64();
  r.expect_end();
  return v;
}

void TcpStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  if (keys.empty()) return;
  std::lock_guard lock(impl_->mutex);
  const std::string what = fmt::format("wait for keys [{}]", join(keys));
  WireWriter w;
  w.u8(static_cast<uint8_t>(Op::wait)).u32(static_cast<uint32_t>(keys.size()));
  for (const std::string& k : keys) w.str(k);
  w.i64(std::max<int64_t>(timeout.count(), 0));
  const Millis waited = reply_wait(timeout);
  std::string reply = impl_->call(w, net::deadline_after(waited), waited, what);
  if (static_cast<Status>(reply[0]) == Status::timeout) {
    WireReader r(reply);
    r.u8();
    std::vector<std::string> missing(r.u32());
    for (std::string& k : missing) k = r.str();
    TESSEL_CHECK_AS(TimeoutError, false, "store {}: timed out after {} ms waiting for keys [{}]; missing [{}]",
                    impl_->where, timeout.count(), join(keys), join(missing));
  }
  impl_->expect_ok(reply, what).expect_end();
}

std::string TcpStore::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  std::lock_guard lock(impl_->mutex);
  const std::string what = fmt::format("compare_set of key '{}'", key);
  std::string reply =
      impl_->call(WireWriter().u8(static_cast<uint8_t>(Op::compare_set)).str(key).str(expected).str(desired),
                  net::deadline_after(timeout_), timeout_, what);
  WireReader r = impl_->expect_ok(reply, what);
  std::string value = r.str();
  r.expect_end();
  return value;
}

bool TcpStore::remove(const std::string& key) {
  std::lock_guard lock(impl_->mutex);
  const std::string what = fmt::format("delete of key '{}'", key);
  std::string reply = impl_->call(WireWriter().u8(static_cast<uint8_t>(Op::remove)).str(key),
                                  net::deadline_after(timeout_), timeout_, what);
  WireReader r = impl_->expect_ok(reply, what);
  const bool existed = r.u8() != 0;
  r.expect_end();
  return existed;
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(impl_->mutex);
  const std::string what = fmt::format("check of keys [{}]", join(keys));
  WireWriter w;
  w.u8(static_cast<uint8_t>(Op::check)).u32(static_cast<uint32_t>(keys.size()));
  for (const std::string& k : keys) w.str(k);
  std::string reply = impl_->call(w, net::deadline_after(timeout_), timeout_, what);
  WireReader r = impl_->expect_ok(reply, what);
  const bool all = r.u8() != 0;
  r.expect_end();
  return all;
}

}  // namespace tessel
