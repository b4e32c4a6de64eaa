// Internal to the TCP store (tcp_store.cc, the client; tcp_store_server.cc, the server): the
// wire protocol both ends speak, described at the top of tcp_store_server.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tessel/comm/tcp_store.h"

namespace tessel::store_wire {

inline constexpr uint32_t kMaxMessage = 64u << 20;  // largest request the client sends, reply it accepts
// Before HELLO a connection may send only this: opcode, token length, token.
inline constexpr std::size_t kMaxHelloFrame = 1 + 4 + kMaxTokenChars;

enum class Op : uint8_t { hello = 1, set, get, add, wait, compare_set, remove, check };
enum class Status : uint8_t { ok = 0, timeout, error, rejected, busy };

// "'a', 'b'": keys for messages.
inline std::string join(const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& k : keys) out += (out.empty() ? "'" : ", '") + k + "'";
  return out;
}

}  // namespace tessel::store_wire
