// store_host: a TCP store server in a process of its own, so a test can measure the store's
// memory from the OS (/proc/<pid>/status) while it attacks it.
//
//   store_host [--token T] [--nofile N] [--stall-ms M] [--quota-mb Q]
//
// Prints "port P" on stdout once it listens, serves until stdin reaches EOF, then exits 0.
// --nofile sets this process's soft limit of open files (a launcher started from a shell has
// 1024), so a flood of connections meets the limit a real store would.
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tessel/comm/tcp_store.h"

int main(int argc, char** argv) {
  tessel::TcpStoreServer::Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--token") {
      o.token = value;
    } else if (flag == "--quota-mb") {
      o.quota_bytes = std::strtoull(value.c_str(), nullptr, 10) << 20;
    } else if (flag == "--stall-ms") {
      o.stall_timeout = tessel::Millis(std::atol(value.c_str()));
    } else if (flag == "--nofile") {
      rlimit lim{};
      ::getrlimit(RLIMIT_NOFILE, &lim);
      lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, std::strtoul(value.c_str(), nullptr, 10));
      if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) std::perror("store_host: setrlimit");
    } else {
      std::fprintf(stderr, "store_host: unknown flag %s\n", flag.c_str());
      return 64;
    }
  }
  try {
    tessel::TcpStoreServer server(o);
    std::printf("port %d\n", server.port());
    std::fflush(stdout);
    char buf[256];
    while (::read(0, buf, sizeof buf) > 0) {
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "store_host: %s\n", e.what());
    return 1;
  }
  return 0;
}
