// The TCP key-value store: a server (hosted by the launcher or by rank 0) and a client that
// implements Store. The server listens on loopback unless given another host address, and
// then refuses to start without a job token of at least 128 bits, which every client must
// present when it connects. Requests are small length-prefixed binary messages; the server
// runs one poll() loop on a background thread, parks blocking get/wait requests until their
// keys appear or their deadline passes, and stops when destroyed.
//
// Wire format (tcp_store.cc): every message is a u32 body length and a body. A request body
// is a u8 opcode and its fields; a reply body is a u8 status (ok, timeout, error, rejected,
// busy) and the op's result. Integers are little-endian; strings are a u32 length and bytes.
// A connection's first request is HELLO with the token; the server closes any connection
// whose first request is not HELLO (with exactly the token, when it has one).
//
// The server cannot be starved (limits in Options, docs/comm.md "Store limits"): before
// HELLO a connection may send only a small handshake frame, within a deadline; connections
// still to authenticate are capped (the oldest is dropped for a newcomer) and so are
// authenticated ones; a half-received request or an unread reply that makes no progress is
// dropped after a stall timeout; replies queued for a connection are bounded (its further
// requests wait); values, keys and the job's whole data have size limits answered with an
// error.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "tessel/comm/store.h"

namespace tessel {

// A store listening beyond loopback needs a token of at least 128 bits: 32 characters, as
// many as 16 random bytes in hex (what `tessel launch` generates; `openssl rand -hex 16`).
inline constexpr std::size_t kMinTokenChars = 32;
// The longest token a client may present (the handshake frame must stay small).
inline constexpr std::size_t kMaxTokenChars = 1024;

// Requests up to this many bytes (every request a rank makes but a large SET) are read from a
// reserve of the buffer budget that large ones may not use (TcpStoreServer::Options).
inline constexpr std::size_t kSmallRequestBytes = 64u << 10;
inline constexpr std::size_t kSmallRequestReserve = 16u << 20;

class TcpStoreServer {
 public:
  struct Options {
    std::string host = "127.0.0.1";  // address to bind; non-loopback requires a token
    int port = 0;                    // 0: an ephemeral port (see port())
    std::string token;               // required of clients when non-empty
    // Limits (docs/comm.md, "Store limits").
    std::size_t max_connections = 4096;  // authenticated clients at once; more are told "busy"
    std::size_t max_pending = 256;       // connections yet to authenticate; the oldest goes for a newcomer
    Millis hello_timeout{5'000};         // a new connection must authenticate within this
    Millis stall_timeout{30'000};        // a half-received request or unread reply may stall this long
    std::size_t max_key_bytes = 4096;
    std::size_t max_value_bytes = 16u << 20;
    std::size_t max_reply_queue_bytes = 4u << 20;  // a connection's unread replies; then its requests wait
    std::size_t quota_bytes = 192u << 20;           // every key and value together (+64 bytes per key)
    // Every connection's received, not yet handled request bytes together. A request past
    // kSmallRequestBytes is read only while they stay under max_buffered_bytes -
    // kSmallRequestReserve, so the requests of ranks (small) always find room. With quota_bytes,
    // this bounds the store's memory: 192 + 48 MiB, under 256 MiB with the process's own (docs/comm.md).
    std::size_t max_buffered_bytes = 48u << 20;
  };
  // Binds (SO_REUSEADDR) and starts serving; throws CommError naming the address when it
  // cannot, when the host is not loopback and the token is shorter than kMinTokenChars
  // (checked before binding), or when the limits contradict each other.
  explicit TcpStoreServer(Options options);
  // Stops the serving thread and closes every connection; clients then get CommError.
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  const std::string& host() const;
  int port() const;

  // One connection's bytes through the server's frame parsing and request handling, without
  // sockets or a thread (fuzz/store_fuzz.cc): runs the frames in `bytes` on a fresh, empty
  // store whose token is `token` as the server runs a client's, and returns the bytes it would
  // send back. Stops where the server would close the connection or park a request.
  static std::string serve_bytes(std::string_view bytes, const std::string& token);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class TcpStore final : public Store {
 public:
  // Connects to host:port, retrying until `timeout` (the server may start later, or be busy
  // with its connection limits); presents `token`. Throws TimeoutError when no server let it
  // in in time and CommError when the server rejected the token, both naming the address. `timeout` also becomes the default
  // timeout of get()/wait() and the reply deadline of the non-blocking calls.
  // One connection per object; calls from several threads are serialised.
  TcpStore(const std::string& host, int port, const std::string& token = "", Millis timeout = default_timeout());
  ~TcpStore() override;

  using Store::get;   // get(key) and wait(keys) with the default timeout
  using Store::wait;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) override;
  bool remove(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessel
