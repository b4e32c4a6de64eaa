// The job options of `tessel launch` checked, and the job token: given, read from a file or
// the environment, or made up for a single node.
#include "tessel/launch/job_options.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "tessel/comm/socket.h"
#include "tessel/comm/tcp_store.h"
#include "tessel/core/error.h"
#include "tessel/launch/attempt.h"
#include "tessel/launch/signals.h"

namespace tessel {

std::string random_token() {
  unsigned char bytes[16];
  net::Fd fd(::open("/dev/urandom", O_RDONLY | O_CLOEXEC));
  std::size_t got = 0;
  while (fd && got < sizeof bytes) {
    const ssize_t k = ::read(fd.get(), bytes + got, sizeof bytes - got);
    if (k > 0) got += static_cast<std::size_t>(k);
    else if (!(k < 0 && errno == EINTR)) break;
  }
  TESSEL_CHECK(got == sizeof bytes, "tessel launch: cannot read 16 random bytes from /dev/urandom for the job token: {}",
               std::strerror(errno));
  std::string hex;
  for (unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

namespace {

// The first line of a token file, without surrounding whitespace; only a regular file will do
// (a pipe could block the launcher).
std::string read_token_file(const std::string& path, bool warn) {
  struct stat st {};
  TESSEL_CHECK(::stat(path.c_str(), &st) == 0, "--token-file '{}': {}", path, std::strerror(errno));
  TESSEL_CHECK(S_ISREG(st.st_mode), "--token-file '{}': not a regular file", path);
  TESSEL_CHECK(st.st_size <= 64 * 1024, "--token-file '{}': {} bytes is too long for a token file", path, st.st_size);
  std::ifstream in(path);
  std::string line;
  TESSEL_CHECK(in.good() && std::getline(in, line), "--token-file '{}': cannot read it{}", path,
               in.good() ? " (empty)" : fmt::format(": {}", std::strerror(errno)));
  const std::size_t b = line.find_first_not_of(" \t\r"), e = line.find_last_not_of(" \t\r");
  line = b == std::string::npos ? std::string() : line.substr(b, e - b + 1);
  TESSEL_CHECK(!line.empty(), "--token-file '{}': the first line holds no token", path);
  if (warn && (st.st_mode & 077) != 0)
    say(fmt::format("warning: --token-file '{}' can be read by other users (mode {:o}); chmod 600 it", path,
                    st.st_mode & 0777));
  return line;
}
}  // namespace

std::string token_of(const LaunchOptions& o, bool warn) {
  TESSEL_CHECK(o.token.empty() || o.token_file.empty(), "--token and --token-file both give the job token; use one");
  if (!o.token.empty()) return o.token;
  if (!o.token_file.empty()) return read_token_file(o.token_file, warn);
  const char* env = std::getenv("TESSEL_JOB_TOKEN");
  return env != nullptr ? std::string(env) : std::string();
}

void check_launch_options(const LaunchOptions& o) {
  TESSEL_CHECK(o.nnodes >= 1, "--nnodes must be at least 1, got {}", o.nnodes);
  TESSEL_CHECK(o.nproc_per_node >= 1, "--nproc-per-node must be at least 1, got {}", o.nproc_per_node);
  TESSEL_CHECK(static_cast<int64_t>(o.nnodes) * o.nproc_per_node <= (1 << 20),
               "--nnodes {} times --nproc-per-node {} is over the limit of {} processes", o.nnodes, o.nproc_per_node,
               1 << 20);
  TESSEL_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes, "--node-rank {} is out of range for --nnodes {} (valid: 0..{})",
               o.node_rank, o.nnodes, o.nnodes - 1);
  TESSEL_CHECK(!o.command.empty() && !o.command[0].empty(),
               "no program to launch: put it after --, e.g. tessel launch --nproc-per-node 2 -- python3 train.py");
  TESSEL_CHECK(o.master_port >= 0 && o.master_port <= 65535, "--master port {} is out of range 1..65535", o.master_port);
  TESSEL_CHECK(!o.master_host.empty(), "--master needs a host, e.g. --master 10.0.0.1:29500");
  TESSEL_CHECK(o.rendezvous_timeout.count() > 0, "--rendezvous-timeout must be positive, got {} ms",
               o.rendezvous_timeout.count());
  TESSEL_CHECK(o.kill_grace.count() >= 0, "--kill-grace must not be negative, got {} ms", o.kill_grace.count());
  TESSEL_CHECK(o.timeout.count() >= 0, "--timeout must be positive, got {} ms", o.timeout.count());
  const std::string token = token_of(o);
  if (o.nnodes > 1) {
    TESSEL_CHECK(o.master_port != 0,
                 "--master HOST:PORT with a port is required with --nnodes {}: every node must find node 0's store "
                 "at the same address",
                 o.nnodes);
    TESSEL_CHECK(!token.empty(),
                 "--nnodes {} needs a job token shared by every node: set the same TESSEL_JOB_TOKEN, or --token-file "
                 "FILE, for each launcher (e.g. from `openssl rand -hex 16`)",
                 o.nnodes);
  }
  // Beyond loopback anyone on the network can knock: the token must resist guessing.
  TESSEL_CHECK(net::is_loopback_host(o.master_host) || token.empty() || token.size() >= kMinTokenChars,
               "--master {}: a store beyond loopback needs a job token of at least 128 bits ({} characters, e.g. from "
               "`openssl rand -hex 16`), got {} characters",
               o.master_host, kMinTokenChars, token.size());
}

}  // namespace tessel
