// The store server's wire protocol on arbitrary bytes: one client's stream (length-prefixed
// frames: HELLO, SET, GET, ADD, WAIT, COMPARE_SET, DELETE, CHECK) through the server's frame
// parsing and handlers (TcpStoreServer::serve_bytes). An input whose first byte is odd runs
// against a server with a token, so the bytes before authentication are exercised too. Every
// reply the server would send must be a well-formed frame; nothing may crash or trip a
// sanitizer.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tessel/comm/tcp_store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string token = data[0] % 2 == 1 ? "fuzz-token" : "";
  const std::string_view stream(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string out = tessel::TcpStoreServer::serve_bytes(stream, token);
  // Replies: u32 little-endian length, then a body of that length starting with a status.
  for (size_t at = 0; at < out.size();) {
    if (out.size() - at < 4) std::abort();
    uint32_t len = 0;
    for (int i = 3; i >= 0; --i) len = (len << 8) | static_cast<uint8_t>(out[at + static_cast<size_t>(i)]);
    if (len == 0 || out.size() - at - 4 < len) {
      std::fprintf(stderr, "malformed reply frame at byte %zu: length %u, %zu bytes left\n", at, len, out.size() - at - 4);
      std::abort();
    }
    at += 4 + len;
  }
  return 0;
}
