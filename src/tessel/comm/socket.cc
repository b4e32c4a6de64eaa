// Socket helpers: TCP listen/connect, deadline-bounded I/O and the store's wire encoding.
#include "tessel/comm/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tessel/core/error.h"

namespace tessel::net {

Deadline deadline_after(Millis timeout) {
  const Deadline now = Clock::now();
  if (timeout.count() <= 0) return now;
  const auto room = std::chrono::duration_cast<Millis>(Deadline::max() - now);
  return timeout >= room ? Deadline::max() : now + timeout;
}

Millis time_left(Deadline deadline) {
  const Deadline now = Clock::now();
  if (deadline <= now) return Millis(0);
  return std::chrono::ceil<Millis>(deadline - now);
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::pair<Fd, Fd> make_pipe() {
  int fds[2];
  TESSEL_CHECK_AS(CommError, ::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0, "cannot create a pipe: {}", std::strerror(errno));
  return {Fd(fds[0]), Fd(fds[1])};
}

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  in_addr a4{};
  if (::inet_pton(AF_INET, host.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  return false;
}

std::string host_port(const std::string& host, int port) {
  if (host.find(':') != std::string::npos && host.front() != '[') return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

namespace {

std::string strip_brackets(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') return host.substr(1, host.size() - 2);
  return host;
}

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list != nullptr) ::freeaddrinfo(list);
  }
};

// Resolves host:port; returns the getaddrinfo error code (0 on success).
int resolve(const std::string& host, int port, bool passive, AddrInfo* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const std::string h = strip_brackets(host);
  const std::string p = std::to_string(port);
  return ::getaddrinfo(h.empty() ? nullptr : h.c_str(), p.c_str(), &hints, &out->list);
}

int bound_port_of(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return -1;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return -1;
}

// Waits for `events` on fd until `deadline`: 1 ready, 0 timed out, -1 error (errno set).
int wait_for(int fd, short events, Deadline deadline) {
  while (true) {
    const Millis left = time_left(deadline);
    pollfd p{fd, events, 0};
    // poll takes an int of milliseconds; wake at least once a minute for very long waits.
    const int ms = static_cast<int>(std::min<int64_t>(left.count(), 60'000));
    const int r = ::poll(&p, 1, ms);
    if (r > 0) return 1;
    if (r == 0) {
      if (time_left(deadline).count() == 0) return 0;
      continue;
    }
    if (errno != EINTR) return -1;
  }
}

}  // namespace

Fd listen_tcp(const std::string& host, int port, int* bound_port) {
  const std::string where = host_port(host, port);
  TESSEL_CHECK_AS(CommError, port >= 0 && port <= 65535, "store server: port {} of {} is out of range 0..65535", port,
                  where);
  AddrInfo ai;
  const int rc = resolve(host, port, /*passive=*/true, &ai);
  TESSEL_CHECK_AS(CommError, rc == 0, "store server: cannot resolve {}: {}", where, ::gai_strerror(rc));
  std::string why = "no usable address";
  for (addrinfo* a = ai.list; a != nullptr; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!fd) {
      why = std::strerror(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    // A deep queue (the kernel caps it at net.core.somaxconn): the ranks of a large job connect
    // at once, and a full queue drops a newcomer's SYN for a second-long retransmit.
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), 4096) != 0) {
      why = std::strerror(errno);
      continue;
    }
    *bound_port = bound_port_of(fd.get());
    return fd;
  }
  TESSEL_CHECK_AS(CommError, false, "store server: cannot listen on {}: {}", where, why);
  return Fd();  // unreachable
}

Fd try_connect_tcp(const std::string& host, int port, Deadline deadline, std::string* why) {
  AddrInfo ai;
  const int rc = resolve(host, port, /*passive=*/false, &ai);
  if (rc != 0) {
    *why = fmt::format("cannot resolve '{}': {}", host, ::gai_strerror(rc));
    return Fd();
  }
  for (addrinfo* a = ai.list; a != nullptr; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!fd) {
      *why = std::strerror(errno);
      continue;
    }
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        *why = std::strerror(errno);
        continue;
      }
      const int w = wait_for(fd.get(), POLLOUT, deadline);
      if (w <= 0) {
        *why = w == 0 ? std::string("connection attempt timed out") : std::strerror(errno);
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        *why = std::strerror(err);
        continue;
      }
    }
    int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
  }
  return Fd();
}

Io send_all(int fd, const void* data, std::size_t n, Deadline deadline, int* err) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      n -= static_cast<std::size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const int w = wait_for(fd, POLLOUT, deadline);
      if (w == 0) return Io::timeout;
      if (w < 0) {
        *err = errno;
        return Io::error;
      }
      continue;
    }
    *err = errno;
    return (errno == EPIPE || errno == ECONNRESET) ? Io::closed : Io::error;
  }
  return Io::ok;
}

Io recv_all(int fd, void* data, std::size_t n, Deadline deadline, int* err) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= static_cast<std::size_t>(k);
      continue;
    }
    if (k == 0) return Io::closed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      const int w = wait_for(fd, POLLIN, deadline);
      if (w == 0) return Io::timeout;
      if (w < 0) {
        *err = errno;
        return Io::error;
      }
      continue;
    }
    *err = errno;
    return errno == ECONNRESET ? Io::closed : Io::error;
  }
  return Io::ok;
}

WireWriter& WireWriter::u8(uint8_t v) {
  body_.push_back(static_cast<char>(v));
  return *this;
}

WireWriter& WireWriter::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) body_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return *this;
}

WireWriter& WireWriter::i64(int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) body_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  return *this;
}

WireWriter& WireWriter::str(std::string_view s) {
  u32(static_cast<uint32_t>(s.size()));
  body_.append(s);
  return *this;
}

std::string WireWriter::frame() const {
  std::string out;
  out.reserve(4 + body_.size());
  const auto n = static_cast<uint32_t>(body_.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out.append(body_);
  return out;
}

uint32_t decode_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

std::string_view WireReader::take(std::size_t n) {
  TESSEL_CHECK_AS(CommError, n <= body_.size() - pos_, "malformed store message: needs {} more bytes at offset {}, has {}",
                  n, pos_, body_.size() - pos_);
  std::string_view out = body_.substr(pos_, n);
  pos_ += n;
  return out;
}

uint8_t WireReader::u8() { return static_cast<uint8_t>(take(1)[0]); }

uint32_t WireReader::u32() { return decode_u32(take(4).data()); }

int64_t WireReader::i64() {
  std::string_view b = take(8);
  uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u |= static_cast<uint64_t>(static_cast<unsigned char>(b[i])) << (8 * i);
  return static_cast<int64_t>(u);
}

std::string WireReader::str() {
  const uint32_t n = u32();
  return std::string(take(n));
}

void WireReader::expect_end() const {
  TESSEL_CHECK_AS(CommError, pos_ == body_.size(), "malformed store message: {} trailing bytes", body_.size() - pos_);
}

}  // namespace tessel::net
