// The TCP store's client: one connection, calls serialised by a mutex (the server and the wire
// protocol are in tcp_store_server.cc).
#include "tessel/comm/tcp_store.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "tessel/comm/socket.h"
#include "tessel/comm/tcp_store_wire.h"
#include "tessel/core/error.h"

namespace tessel {

namespace {

using namespace store_wire;
using net::Clock;
using net::Deadline;
using net::WireReader;
using net::WireWriter;

constexpr Millis kReplyGrace{2000};  // client waits this much past a blocking call's timeout
constexpr Millis kMinHelloTimeout{2000};

// How long a client waits for the reply to a blocking call: the server answers at `timeout`,
// the grace covers the trip; saturates for "forever".
Millis reply_wait(Millis timeout) {
  timeout = std::max(timeout, Millis(0));
  return timeout > Millis::max() - kReplyGrace ? Millis::max() : timeout + kReplyGrace;
}

}  // namespace

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
  TESSEL_CHECK(token.size() <= kMaxTokenChars, "store: cannot connect to {}: the job token has {} characters, over the "
               "limit of {}", impl_->where, token.size(), kMaxTokenChars);
  const Deadline deadline = net::deadline_after(timeout);
  Millis backoff{10};
  std::string why;
  while (true) {
    impl_->fd = net::try_connect_tcp(host, port, deadline, &why);
    if (impl_->fd) {
      const Millis hello_wait = std::max(net::time_left(deadline), kMinHelloTimeout);
      std::string reply;
      try {
        reply = impl_->call(WireWriter().u8(static_cast<uint8_t>(Op::hello)).str(token),
                            net::deadline_after(hello_wait), hello_wait, "hello");
      } catch (const TimeoutError&) {
        throw;
      } catch (const CommError&) {
        reply.clear();  // hung up before answering: dropped while at a connection limit
      }
      const auto status = reply.empty() ? Status::busy : static_cast<Status>(WireReader(reply).u8());
      TESSEL_CHECK_AS(CommError, status != Status::rejected,
                      "store {}: the server rejected this client's job token ({}); every launcher and rank of a job "
                      "must use the same TESSEL_JOB_TOKEN / --token-file",
                      impl_->where, token.empty() ? "none given" : "token given");
      if (status == Status::ok) {
        impl_->lost.clear();
        return;
      }
      // Busy: the server is at its limit of connections; others will leave or time out.
      impl_->fd.reset();
      why = "the server is at its connection limit (busy)";
    }
    TESSEL_CHECK_AS(TimeoutError, Clock::now() < deadline,
                    "store: could not connect to {} within {} ms: {} (is the store's server, e.g. node 0's launcher, "
                    "running?)",
                    impl_->where, timeout.count(), why);
    std::this_thread::sleep_for(std::min(backoff, net::time_left(deadline)));
    backoff = std::min(backoff * 2, Millis(200));
  }
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
