// Socket helpers shared by the TCP store's server and client: an owning file descriptor,
// deadlines, TCP listen/connect, whole-buffer send/receive that give up at a deadline, and
// the wire encoding of store messages (little-endian integers, u32-length-prefixed strings).
// Every descriptor is created close-on-exec, so processes the launcher forks never inherit
// the store's sockets.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "tessel/comm/store.h"

namespace tessel::net {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// now + timeout, saturating (a timeout of years must not overflow the clock).
Deadline deadline_after(Millis timeout);
// Time left until `deadline`, never negative.
Millis time_left(Deadline deadline);

// An owned file descriptor, closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// A non-blocking, close-on-exec pipe: {read end, write end}. Throws CommError.
std::pair<Fd, Fd> make_pipe();
void set_nonblocking(int fd);

// Whether `host` names this machine's loopback: 127.x.x.x, ::1 or "localhost".
bool is_loopback_host(const std::string& host);
// "host:port", bracketing IPv6 literals.
std::string host_port(const std::string& host, int port);

// Binds host:port with SO_REUSEADDR and listens (port 0: an ephemeral port); the socket is
// non-blocking. Stores the bound port in *bound_port. Throws CommError naming the address.
Fd listen_tcp(const std::string& host, int port, int* bound_port);

// One attempt to connect to host:port, giving up at `deadline`. Returns a non-blocking
// connected socket, or an empty Fd with the reason in *why (refused, unreachable, ...).
Fd try_connect_tcp(const std::string& host, int port, Deadline deadline, std::string* why);

enum class Io { ok, closed, timeout, error };
// Sends or receives exactly n bytes on a non-blocking socket before `deadline`; on
// Io::error, *err holds errno.
Io send_all(int fd, const void* data, std::size_t n, Deadline deadline, int* err);
Io recv_all(int fd, void* data, std::size_t n, Deadline deadline, int* err);

// A message body under construction; frame() prepends its u32 length.
class WireWriter {
 public:
  WireWriter& u8(uint8_t v);
  WireWriter& u32(uint32_t v);
  WireWriter& i64(int64_t v);
  WireWriter& str(std::string_view s);
  std::size_t size() const { return body_.size(); }
  std::string frame() const;

 private:
  std::string body_;
};

// Reads a message body; every accessor throws CommError("malformed store message: ...")
// when the body is too short, so a bad peer cannot make the reader overrun.
class WireReader {
 public:
  explicit WireReader(std::string_view body) : body_(body) {}
  uint8_t u8();
  uint32_t u32();
  int64_t i64();
  std::string str();
  // Throws unless every byte was consumed.
  void expect_end() const;

 private:
  std::string_view take(std::size_t n);
  std::string_view body_;
  std::size_t pos_ = 0;
};

uint32_t decode_u32(const char* p);

}  // namespace tessel::net
