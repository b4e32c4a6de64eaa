// A link between two network namespaces with a rate, a fixed one-way delay and a bounded queue,
// emulated in userspace for kernels without netem (bench/a2a_two_nodes.sh uses it).
//
// One TUN device is made in each namespace (setns(2) into /var/run/netns/<name>, open
// /dev/net/tun, TUNSETIFF; the device stays in the namespace it was made in), and every IP
// packet one side's kernel routes into its device is written into the other's after the time a
// real link would take: a packet of S bytes that arrives at t starts on the wire at
// max(t, when the wire is free), holds the wire S·8/rate seconds, and comes out `delay` later.
// A packet that would wait longer than `queue` for the wire is dropped, as a full switch or NIC
// queue drops it (TCP sees a loss, not an ever-growing delay). Both directions are independent.
//
//   link_emulator --ns NAME0 --ns NAME1 --dev DEV0 --dev DEV1 [--rate 1gbit] [--delay 0]
//                 [--queue 5ms] [--mtu 9000] [--lifetime 600]
//
// Rates take bit, kbit, mbit, gbit (tc's units, powers of ten); times us, ms, s (bare: us).
// Prints "ready" once both devices exist (the caller then addresses them and brings them up),
// and at exit one line per direction: packets and bytes relayed and dropped.
//
// Its life is bounded: it exits on SIGTERM/SIGINT, when its parent exits (PR_SET_PDEATHSIG),
// when either namespace's /var/run/netns file goes, and after --lifetime seconds. The devices
// are not persistent, so they vanish with it. It touches nothing but the two devices it makes.
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using Nanos = std::chrono::nanoseconds;

volatile sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "link_emulator: %s\n", what.c_str());
  std::exit(1);
}

// "1gbit", "200mbit", "125000000" (bits per second).
double parse_rate(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  const std::string unit(end);
  double scale = 0;
  if (unit.empty() || unit == "bit" || unit == "bps") scale = 1;
  else if (unit == "kbit") scale = 1e3;
  else if (unit == "mbit") scale = 1e6;
  else if (unit == "gbit") scale = 1e9;
  if (end == s.c_str() || scale == 0 || v <= 0) die("--rate '" + s + "': expected a positive number with bit, kbit, mbit or gbit");
  return v * scale;
}

// "2ms", "500us", "0.5ms", "1s", "0".
Nanos parse_time(const std::string& flag, const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  const std::string unit(end);
  double scale = 0;
  if (unit.empty() || unit == "us") scale = 1e3;
  else if (unit == "ms") scale = 1e6;
  else if (unit == "s") scale = 1e9;
  if (end == s.c_str() || scale == 0 || v < 0) die(flag + " '" + s + "': expected a time like 500us, 2ms or 1s");
  return Nanos(static_cast<int64_t>(v * scale));
}

// Makes TUN device `dev` inside the namespace of /var/run/netns/`ns`; returns its fd (non-blocking).
int make_tun(const std::string& ns, const std::string& dev, int home) {
  const std::string path = "/var/run/netns/" + ns;
  const int nsfd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (nsfd < 0) die("cannot open " + path + ": " + std::strerror(errno));
  if (::setns(nsfd, CLONE_NEWNET) != 0) die("setns into " + path + ": " + std::strerror(errno));
  ::close(nsfd);
  const int fd = ::open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) die(std::string("cannot open /dev/net/tun: ") + std::strerror(errno));
  ifreq ifr{};
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;  // bare IP packets, no header
  if (dev.size() >= IFNAMSIZ) die("--dev '" + dev + "': longer than " + std::to_string(IFNAMSIZ - 1) + " characters");
  std::strncpy(ifr.ifr_name, dev.c_str(), IFNAMSIZ - 1);
  if (::ioctl(fd, TUNSETIFF, &ifr) != 0) die("TUNSETIFF " + dev + " in " + ns + ": " + std::strerror(errno));
  if (::setns(home, CLONE_NEWNET) != 0) die(std::string("setns back: ") + std::strerror(errno));
  return fd;
}

struct Packet {
  Clock::time_point out;  // when it leaves the far end of the link
  std::vector<char> bytes;
};

// One direction of the link: packets read from `from` are written to `to` at their time.
struct Direction {
  int from = -1, to = -1;
  std::string name;
  Clock::time_point wire_free{};  // when the last accepted packet has left the wire
  std::deque<Packet> in_flight;   // in order of `out` (FIFO wire, fixed delay)
  uint64_t packets = 0, bytes = 0, dropped = 0, write_failed = 0;
};

struct Link {
  double rate;   // bits per second
  Nanos delay;   // one way
  Nanos queue;   // longest wait for the wire before a packet is dropped
};

// Reads every packet waiting on d.from and schedules (or drops) it.
void take(Direction& d, const Link& link, std::vector<char>& buf) {
  for (;;) {
    const ssize_t n = ::read(d.from, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      die(d.name + ": read: " + std::strerror(errno));
    }
    if (n == 0) return;
    const auto now = Clock::now();
    const auto start = std::max(now, d.wire_free);
    if (start - now > link.queue) {  // the queue ahead of the wire is full
      ++d.dropped;
      continue;
    }
    d.wire_free = start + Nanos(static_cast<int64_t>(static_cast<double>(n) * 8e9 / link.rate));
    d.in_flight.push_back(Packet{d.wire_free + link.delay, std::vector<char>(buf.data(), buf.data() + n)});
  }
}

// Writes the packets whose time has come; returns when the next one is due (or max()).
Clock::time_point deliver(Direction& d) {
  const auto now = Clock::now();
  while (!d.in_flight.empty() && d.in_flight.front().out <= now) {
    const Packet& p = d.in_flight.front();
    // A TUN write either takes the whole packet or fails (the far stack drops it as a NIC
    // would when its own queue overflows); it never blocks.
    if (::write(d.to, p.bytes.data(), p.bytes.size()) == static_cast<ssize_t>(p.bytes.size())) {
      ++d.packets;
      d.bytes += p.bytes.size();
    } else {
      ++d.write_failed;
    }
    d.in_flight.pop_front();
  }
  return d.in_flight.empty() ? Clock::time_point::max() : d.in_flight.front().out;
}

bool exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> ns, dev;
  Link link{1e9, Nanos(0), parse_time("--queue", "5ms")};
  int mtu = 9000;
  double lifetime_s = 600;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) die("option '" + a + "' needs a value");
    const std::string v = argv[++i];
    if (a == "--ns") ns.push_back(v);
    else if (a == "--dev") dev.push_back(v);
    else if (a == "--rate") link.rate = parse_rate(v);
    else if (a == "--delay") link.delay = parse_time(a, v);
    else if (a == "--queue") link.queue = parse_time(a, v);
    else if (a == "--mtu") mtu = std::atoi(v.c_str());
    else if (a == "--lifetime") lifetime_s = std::atof(v.c_str());
    else die("unknown option '" + a + "'");
  }
  if (ns.size() != 2 || dev.size() != 2) die("needs --ns and --dev twice each (one per namespace)");
  if (mtu < 576 || mtu > 65535) die("--mtu " + std::to_string(mtu) + ": expected 576..65535");

  // Bounded life: the caller's death, a signal, the namespaces' removal or the lifetime ends it.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() == 1) return 0;  // the parent is already gone
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGHUP, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  const int home = ::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (home < 0) die(std::string("cannot open /proc/self/ns/net: ") + std::strerror(errno));
  const int fd0 = make_tun(ns[0], dev[0], home), fd1 = make_tun(ns[1], dev[1], home);
  ::close(home);
  std::printf("ready\n");
  std::fflush(stdout);

  Direction d[2];
  d[0].from = fd0, d[0].to = fd1, d[0].name = ns[0] + " -> " + ns[1];
  d[1].from = fd1, d[1].to = fd0, d[1].name = ns[1] + " -> " + ns[0];
  std::vector<char> buf(static_cast<size_t>(std::max(mtu, 65535)));
  const auto started = Clock::now();
  const auto end = started + Nanos(static_cast<int64_t>(lifetime_s * 1e9));
  auto next_check = started;
  while (!g_stop) {
    const auto now = Clock::now();
    if (now >= end) break;
    if (now >= next_check) {  // every 100 ms: are both namespaces still there?
      if (!exists("/var/run/netns/" + ns[0]) || !exists("/var/run/netns/" + ns[1])) break;
      next_check = now + std::chrono::milliseconds(100);
    }
    const auto due = std::min({deliver(d[0]), deliver(d[1]), next_check, end});
    const auto wait = std::max(Nanos(0), std::chrono::duration_cast<Nanos>(due - Clock::now()));
    timespec ts{static_cast<time_t>(wait.count() / 1000000000), static_cast<long>(wait.count() % 1000000000)};
    pollfd fds[2] = {{fd0, POLLIN, 0}, {fd1, POLLIN, 0}};
    const int r = ::ppoll(fds, 2, &ts, nullptr);
    if (r < 0) {
      if (errno == EINTR) continue;
      die(std::string("ppoll: ") + std::strerror(errno));
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].revents & (POLLERR | POLLHUP | POLLNVAL)) g_stop = 1;  // the device went away
      if (fds[i].revents & POLLIN) take(d[i], link, buf);
    }
  }
  for (const Direction& x : d)
    std::fprintf(stderr, "link_emulator: %s: %llu packets, %llu bytes relayed; %llu dropped (queue full), %llu refused by the far end\n",
                 x.name.c_str(), static_cast<unsigned long long>(x.packets), static_cast<unsigned long long>(x.bytes),
                 static_cast<unsigned long long>(x.dropped), static_cast<unsigned long long>(x.write_failed));
  return 0;
}
