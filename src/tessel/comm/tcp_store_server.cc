// The TCP store's server: single-threaded, poll()-driven (the client is tcp_store.cc).
//
// Requests (opcode, then fields):
//   HELLO token | SET key value | GET key timeout_ms | ADD key delta | WAIT n keys... timeout_ms
//   COMPARE_SET key expected desired | DELETE key | CHECK n keys...
// Replies (status, then fields):
//   ok      HELLO/SET/WAIT: nothing; GET/COMPARE_SET: value; ADD: i64; DELETE/CHECK: u8
//   timeout n keys...  (the keys still missing when the deadline passed)
//   error   message    (e.g. ADD on a value that is not an integer)
//   rejected           (bad token; the server then closes the connection)
//   busy               (to HELLO: the server is at a connection limit and closes; retry)
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
#include <set>

#include "tessel/comm/socket.h"
#include "tessel/comm/tcp_store_wire.h"
#include "tessel/core/error.h"
#include "tessel/core/log.h"

namespace tessel {

namespace {

using namespace store_wire;
using net::Clock;
using net::Deadline;
using net::WireReader;
using net::WireWriter;

constexpr std::size_t kKeyOverhead = 64;  // quota charge of a key beyond its bytes (its map node)
constexpr int kMaxAcceptsPerRound = 1024;  // then the others' requests run again
constexpr Millis kAcceptPause{100};        // out of descriptors with nothing to drop: retry after this
constexpr Millis kMaxTick{1000};           // longest poll() sleep while a deadline is pending

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
    bool closing = false;            // drop at the end of this round
    bool close_after_flush = false;  // drop once `out` is sent (a rejection or "busy")
    std::size_t skip = 0;            // bytes of an oversized request still to discard
    Deadline hello_deadline{};       // authenticate by then
    Deadline in_progress{};          // when the last request bytes arrived or a request ran
    Deadline out_progress{};         // when reply bytes last left (or the queue last filled from empty)
  };
  struct Parked {
    uint64_t client;
    Op op;
    std::vector<std::string> keys;
    Deadline deadline;
  };

  Options options;
  std::string where;  // host:port, for messages
  std::size_t max_request = 0;
  int port = 0;
  net::Fd listener;
  net::Fd stop_read, stop_write;
  std::thread thread;

  // Owned by the server thread once it runs.
  std::map<uint64_t, Client> clients;
  std::set<uint64_t> pending;  // ids of the clients yet to authenticate, oldest first
  std::size_t authed = 0;
  std::list<Parked> parked;
  std::map<std::string, std::string> data;
  std::size_t stored = 0;  // quota charge of `data`
  std::size_t buffered = 0;  // Σ clients' in.size(): what max_buffered_bytes bounds
  uint64_t next_id = 1;
  Deadline accept_paused_until{};
  Deadline next_fd_warning{};

  void run();
  void serve();
  void accept_clients();
  void evict_oldest_pending();
  void read_client(Client& c);
  bool process_frames(uint64_t id, Client& c);
  void handle(uint64_t id, Client& c, std::string_view body);
  bool release_parked();
  void flush(Client& c);
  // Closes, drops and forgets every client marked closing; enforces the deadlines; returns
  // the next time one falls due.
  Deadline sweep();
  void queue(Client& c, const std::string& frame) {
    if (c.out.empty()) c.out_progress = Clock::now();
    c.out += frame;
  }
  std::size_t in_cap(const Client& c) const { return 4 + (c.authed ? max_request : kMaxHelloFrame); }
  // The whole frame `c` is receiving, once its length has arrived (else 0).
  static std::size_t frame_bytes(const Client& c) {
    return c.in.size() >= 4 ? 4 + std::size_t{net::decode_u32(c.in.data())} : 0;
  }
  // The bytes `c` may receive now: up to one largest request (a handshake before
  // authentication), and only as much as the budget of all connections allows — a small
  // request from its reserve, a large one from the rest (it waits; the stall rule drops it if
  // it waits too long).
  std::size_t input_room(const Client& c) const {
    const std::size_t room = in_cap(c) - std::min(in_cap(c), c.in.size());
    const std::size_t frame = frame_bytes(c);
    const bool small = frame != 0 ? frame <= kSmallRequestBytes : c.in.size() < kSmallRequestBytes;
    const std::size_t budget = options.max_buffered_bytes;
    const std::size_t limit = small ? budget : budget - std::min(budget, kSmallRequestReserve);
    return std::min(room, limit - std::min(limit, buffered));
  }
  bool wants_input(const Client& c) const {
    return !c.closing && !c.close_after_flush && c.out.size() < options.max_reply_queue_bytes &&
           (c.skip > 0 || input_room(c) > 0);
  }
  static std::size_t charge(const std::string& key, std::size_t value_bytes) {
    return key.size() + value_bytes + kKeyOverhead;
  }
  // "" when `key` may hold a value of `value_bytes`, else the error to answer.
  std::string check_put(const std::string& key, std::size_t value_bytes) const;
  void put(const std::string& key, std::string value);
  bool has(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data.count(k) > 0; });
  }
};

TcpStoreServer::TcpStoreServer(Options options) : impl_(std::make_unique<Impl>()) {
  const std::string where = net::host_port(options.host, options.port);
  // The token is checked before anything is bound: an open port without a strong one would
  // let any host on the network guess its way into the job's rendezvous.
  TESSEL_CHECK_AS(CommError, options.token.size() >= kMinTokenChars || net::is_loopback_host(options.host),
                  "store server: listening on {} (not a loopback address) requires a job token of at least 128 bits "
                  "({} characters, e.g. `openssl rand -hex 16`){}; set TESSEL_JOB_TOKEN or pass --token-file, or "
                  "listen on 127.0.0.1",
                  where, kMinTokenChars,
                  options.token.empty() ? std::string() : fmt::format(", got {} characters", options.token.size()));
  TESSEL_CHECK_AS(CommError, options.token.size() <= kMaxTokenChars,
                  "store server on {}: the job token has {} characters, over the limit of {}", where,
                  options.token.size(), kMaxTokenChars);
  TESSEL_CHECK_AS(CommError,
                  options.max_connections >= 1 && options.max_pending >= 1 && options.hello_timeout.count() > 0 &&
                      options.stall_timeout.count() > 0 && options.max_key_bytes >= 1 &&
                      options.max_value_bytes <= kMaxMessage / 2 && options.max_key_bytes <= kMaxMessage / 4,
                  "store server on {}: inconsistent limits (connections {}, pending {}, hello {} ms, stall {} ms, key {} "
                  "bytes, value {} bytes; values may be at most {} bytes)",
                  where, options.max_connections, options.max_pending, options.hello_timeout.count(),
                  options.stall_timeout.count(), options.max_key_bytes, options.max_value_bytes, kMaxMessage / 2);
  impl_->options = std::move(options);
  // COMPARE_SET carries a key and two values; WAIT and CHECK carry keys that fit the same frame.
  impl_->max_request = 64 + impl_->options.max_key_bytes + 2 * impl_->options.max_value_bytes;
  impl_->listener = net::listen_tcp(impl_->options.host, impl_->options.port, &impl_->port);
  impl_->where = net::host_port(impl_->options.host, impl_->port);
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
    log_error("store server on {} stopped: {}", where, e.what());
  }
  clients.clear();
  parked.clear();
}

void TcpStoreServer::Impl::serve() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  Deadline wake = Deadline::max();
  while (true) {
    fds.clear();
    ids.clear();
    const bool accepting = Clock::now() >= accept_paused_until;
    fds.push_back({stop_read.get(), POLLIN, 0});
    fds.push_back({listener.get(), static_cast<short>(accepting ? POLLIN : 0), 0});
    for (auto& [id, c] : clients) {
      const short events = static_cast<short>((wants_input(c) ? POLLIN : 0) | (c.out.empty() ? 0 : POLLOUT));
      fds.push_back({c.fd.get(), events, 0});
      ids.push_back(id);
    }
    if (!accepting) wake = std::min(wake, accept_paused_until);
    for (const Parked& p : parked) wake = std::min(wake, p.deadline);
    const int timeout_ms =
        wake == Deadline::max() ? -1 : static_cast<int>(std::min(net::time_left(wake), kMaxTick).count());
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
      Client& c = it->second;
      if (ev & POLLIN) {
        read_client(c);
      } else if (ev & (POLLHUP | POLLERR)) {
        c.closing = true;  // hung up while its input was held back
      }
      if ((ev & POLLOUT) && !c.closing) flush(c);
    }

    // Run every complete frame; a change of data may release parked requests, whose clients
    // may then have further frames: repeat until nothing moves.
    bool progress = true;
    while (progress) {
      progress = false;
      for (auto& [id, c] : clients)
        if (!c.closing && process_frames(id, c)) progress = true;
      if (release_parked()) progress = true;
    }
    // Accepted after the others' frames ran, so a client that authenticated this round is no
    // longer pending and cannot be dropped for a newcomer.
    if (fds[1].revents & POLLIN) accept_clients();
    wake = sweep();
  }
}

void TcpStoreServer::Impl::accept_clients() {
  for (int n = 0; n < kMaxAcceptsPerRound; ++n) {
    const int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        // Out of descriptors: an unauthenticated connection gives its one up; with none, the
        // connection waits in the kernel's queue (rather than the loop spinning on it).
        if (!pending.empty()) {
          evict_oldest_pending();
          continue;
        }
        accept_paused_until = Clock::now() + kAcceptPause;
        if (Clock::now() >= next_fd_warning) {
          log_warn("store server on {}: cannot accept a connection: {} ({} authenticated clients; raise the limit "
                   "with `ulimit -n`)",
                   where, std::strerror(errno), authed);
          next_fd_warning = Clock::now() + Millis(10'000);
        }
      }
      return;
    }
    if (pending.size() >= options.max_pending) evict_oldest_pending();
    const uint64_t id = next_id++;
    Client& c = clients[id];
    c.fd = net::Fd(fd);
    const Deadline now = Clock::now();
    c.hello_deadline = now + options.hello_timeout;
    c.in_progress = now;
    pending.insert(id);
    // A client sends HELLO as soon as it connects: take it now, so that a flood of silent
    // connections cannot push a real one out before it is read.
    read_client(c);
    process_frames(id, c);
  }
}

void TcpStoreServer::Impl::evict_oldest_pending() {
  const uint64_t id = *pending.begin();
  pending.erase(pending.begin());
  Client& c = clients.at(id);
  // Best effort: a real client that was too slow retries on "busy".
  const std::string frame = WireWriter().u8(static_cast<uint8_t>(Status::busy)).frame();
  (void)::send(c.fd.get(), frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  c.fd.reset();  // now: the descriptor may be what a newcomer needs
  c.closing = true;
}

void TcpStoreServer::Impl::read_client(Client& c) {
  char buf[65536];
  while (!c.closing && c.fd) {
    // Only as much as the connection may hold: one largest request (a handshake before
    // authentication); the rest waits in the kernel and, beyond that, in the client.
    const std::size_t room = c.skip > 0 ? sizeof buf : input_room(c);
    if (room == 0) return;
    const ssize_t k = ::recv(c.fd.get(), buf, std::min(room, sizeof buf), 0);
    if (k > 0) {
      c.in_progress = Clock::now();
      std::size_t n = static_cast<std::size_t>(k), used = 0;
      if (c.skip > 0) {
        used = std::min(c.skip, n);
        c.skip -= used;
      }
      if (c.in.empty() && n - used >= 4) c.in.reserve(std::min(in_cap(c), 4 + std::size_t{net::decode_u32(buf + used)}));
      c.in.append(buf + used, n - used);
      buffered += n - used;
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
  // A parked GET/WAIT holds back later frames, and so does a full reply queue: replies stay
  // in request order and bounded.
  while (!c.closing && !c.close_after_flush && c.skip == 0 && !c.parked &&
         c.out.size() < options.max_reply_queue_bytes && c.in.size() - pos >= 4) {
    const uint32_t len = net::decode_u32(c.in.data() + pos);
    if (len == 0 || (!c.authed && len > kMaxHelloFrame)) {
      c.closing = true;  // malformed, or more than a handshake from a stranger
      break;
    }
    if (len > max_request) {
      // Answered at once and the body discarded as it arrives: the connection stays usable.
      queue(c, reply_error(fmt::format(
                   "store {}: a request of {} bytes is over the store's limit of {} bytes (values up to {} bytes, keys "
                   "up to {} bytes)",
                   where, len, max_request, options.max_value_bytes, options.max_key_bytes)));
      const std::size_t have = std::min<std::size_t>(len, c.in.size() - pos - 4);
      c.skip = len - have;
      pos += 4 + have;
      any = true;
      continue;
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
  if (pos > 0) {
    c.in.erase(0, pos);
    buffered -= pos;
    // A large request's buffer goes back once handled, as a large reply's does once sent.
    if (c.in.capacity() > kSmallRequestBytes) std::string(c.in).swap(c.in);
  }
  if (any) c.in_progress = Clock::now();
  return any;
}

std::string TcpStoreServer::Impl::check_put(const std::string& key, std::size_t value_bytes) const {
  if (key.size() > options.max_key_bytes)
    return fmt::format("store {}: a key of {} bytes is over the store's limit of {} bytes (key starts '{}')", where,
                       key.size(), options.max_key_bytes, key.substr(0, 64));
  if (value_bytes > options.max_value_bytes)
    return fmt::format("store {}: the value for key '{}' has {} bytes, over the store's limit of {} bytes", where, key,
                       value_bytes, options.max_value_bytes);
  auto it = data.find(key);
  const std::size_t after = stored - (it == data.end() ? 0 : charge(key, it->second.size())) + charge(key, value_bytes);
  if (after > options.quota_bytes)
    return fmt::format("store {}: setting key '{}' ({} bytes) would make the job's data {} bytes, over its quota of {} "
                       "bytes (each key counts its bytes, its value's and {}); delete keys that are no longer needed",
                       where, key, value_bytes, after, options.quota_bytes, kKeyOverhead);
  return "";
}

void TcpStoreServer::Impl::put(const std::string& key, std::string value) {
  auto [it, fresh] = data.try_emplace(key);
  if (!fresh) stored -= charge(key, it->second.size());
  stored += charge(key, value.size());
  it->second = std::move(value);
}

void TcpStoreServer::Impl::handle(uint64_t id, Client& c, std::string_view body) {
  WireReader r(body);
  const auto op = static_cast<Op>(r.u8());
  if (!c.authed) {
    bool ok = false;
    if (op == Op::hello) {
      const std::string token = r.str();
      r.expect_end();
      ok = options.token.empty() || equal_constant_time(token, options.token);
    }
    pending.erase(id);
    if (!ok) {
      queue(c, WireWriter().u8(static_cast<uint8_t>(Status::rejected)).frame());
      c.close_after_flush = true;
      return;
    }
    if (authed >= options.max_connections) {
      queue(c, WireWriter().u8(static_cast<uint8_t>(Status::busy)).frame());
      c.close_after_flush = true;
      return;
    }
    c.authed = true;
    ++authed;
    queue(c, reply_ok());
    return;
  }
  switch (op) {
    case Op::hello: {
      r.str();
      r.expect_end();
      queue(c, reply_ok());
      return;
    }
    case Op::set: {
      std::string key = r.str();
      std::string value = r.str();
      r.expect_end();
      if (std::string why = check_put(key, value.size()); !why.empty()) {
        queue(c, reply_error(why));
        return;
      }
      put(key, std::move(value));
      queue(c, reply_ok());
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
          queue(c, reply_error(fmt::format("store add: key '{}' holds '{}', not an integer", key, s.substr(0, 64))));
          return;
        }
      }
      if (__builtin_add_overflow(v, delta, &v)) {
        queue(c, reply_error(fmt::format("store add: key '{}' would overflow a 64-bit integer", key)));
        return;
      }
      std::string text = std::to_string(v);
      if (std::string why = check_put(key, text.size()); !why.empty()) {
        queue(c, reply_error(why));
        return;
      }
      put(key, std::move(text));
      queue(c, WireWriter().u8(static_cast<uint8_t>(Status::ok)).i64(v).frame());
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
        if (std::string why = check_put(key, desired.size()); !why.empty()) {
          queue(c, reply_error(why));
          return;
        }
        result = desired;
        put(key, std::move(desired));
      } else if (it != data.end()) {
        result = it->second;
      }
      queue(c, WireWriter().u8(static_cast<uint8_t>(Status::ok)).str(result).frame());
      return;
    }
    case Op::remove: {
      const std::string key = r.str();
      r.expect_end();
      auto it = data.find(key);
      const bool existed = it != data.end();
      if (existed) {
        stored -= charge(key, it->second.size());
        data.erase(it);
      }
      queue(c, WireWriter().u8(static_cast<uint8_t>(Status::ok)).u8(existed ? 1 : 0).frame());
      return;
    }
    case Op::check: {
      const uint32_t n = r.u32();
      std::vector<std::string> keys;
      for (uint32_t i = 0; i < n; ++i) keys.push_back(r.str());
      r.expect_end();
      queue(c, WireWriter().u8(static_cast<uint8_t>(Status::ok)).u8(has(keys) ? 1 : 0).frame());
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
        queue(c, WireWriter().u8(static_cast<uint8_t>(Status::ok)).str(data.at(it->keys[0])).frame());
      else
        queue(c, reply_ok());
    } else if (now >= it->deadline) {
      WireWriter w;
      w.u8(static_cast<uint8_t>(Status::timeout));
      std::vector<std::string> missing;
      for (const std::string& k : it->keys)
        if (!data.count(k)) missing.push_back(k);
      w.u32(static_cast<uint32_t>(missing.size()));
      for (const std::string& k : missing) w.str(k);
      queue(c, w.frame());
    } else {
      ++it;
      continue;
    }
    c.parked = false;
    c.in_progress = now;  // its held-back frames were not the client's delay
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
  if (sent > 0) c.out_progress = Clock::now();
  c.out.erase(0, sent);
  if (c.out.empty() && c.out.capacity() > kSmallRequestBytes) std::string().swap(c.out);
}

Deadline TcpStoreServer::Impl::sweep() {
  Deadline wake = Deadline::max();
  const Deadline now = Clock::now();
  for (auto it = clients.begin(); it != clients.end();) {
    const uint64_t id = it->first;
    Client& c = it->second;
    if (!c.closing && !c.out.empty()) flush(c);
    if (!c.closing && c.close_after_flush && c.out.empty()) c.closing = true;
    if (!c.closing) {
      const bool partial = !c.parked && (c.skip > 0 || !c.in.empty());
      if (!c.authed) {
        if (now >= c.hello_deadline) c.closing = true;  // silent or slow stranger
        wake = std::min(wake, c.hello_deadline);
      } else if (!c.out.empty() && now - c.out_progress >= options.stall_timeout) {
        log_warn("store server on {}: dropping a client that read none of its {} queued reply bytes for {} ms (a "
                 "connection may queue {} bytes of replies)",
                 where, c.out.size(), options.stall_timeout.count(), options.max_reply_queue_bytes);
        c.closing = true;
      } else if (partial && c.out.empty() && now - c.in_progress >= options.stall_timeout) {
        log_warn("store server on {}: dropping a client whose request stopped arriving {} ms ago", where,
                 options.stall_timeout.count());
        c.closing = true;
      } else {
        if (!c.out.empty()) wake = std::min(wake, c.out_progress + options.stall_timeout);
        if (partial) wake = std::min(wake, c.in_progress + options.stall_timeout);
      }
    }
    if (c.closing) {
      parked.remove_if([id](const Parked& p) { return p.client == id; });
      pending.erase(id);
      if (c.authed) --authed;
      buffered -= c.in.size();
      it = clients.erase(it);
    } else {
      ++it;
    }
  }
  return wake;
}

std::string TcpStoreServer::serve_bytes(std::string_view bytes, const std::string& token) {
  Impl impl;
  impl.options.token = token;
  impl.max_request = 64 + impl.options.max_key_bytes + 2 * impl.options.max_value_bytes;
  impl.where = "serve_bytes";
  const uint64_t id = impl.next_id++;
  Impl::Client& c = impl.clients[id];
  c.authed = token.empty();
  if (c.authed) ++impl.authed;
  else impl.pending.insert(id);
  c.in.assign(bytes);
  impl.buffered = c.in.size();
  while (!c.closing && !c.close_after_flush && !c.parked && impl.process_frames(id, c)) impl.release_parked();
  return c.out;
}

}  // namespace tessel
