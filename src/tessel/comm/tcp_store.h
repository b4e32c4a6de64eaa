// The TCP key-value store: a server (hosted by the launcher or by rank 0) and a client that
// implements Store. The server listens on loopback unless given another host address, and
// then refuses to start without a job token, which every client must present when it
// connects. Requests are small length-prefixed binary messages; the server runs one
// poll() loop on a background thread, parks blocking get/wait requests until their keys
// appear or their deadline passes, and stops when destroyed.
//
// Wire format (tcp_store.cc): every message is a u32 body length (at most 64 MiB) and a
// body. A request body is a u8 opcode and its fields; a reply body is a u8 status (ok,
// timeout, error, rejected) and the op's result. Integers are little-endian; strings are a
// u32 length and bytes. A connection's first request is HELLO with the token; a server with a
// token closes any connection whose first request is not HELLO with exactly that token.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "tessel/comm/store.h"

namespace tessel {

class TcpStoreServer {
 public:
  struct Options {
    std::string host = "127.0.0.1";  // address to bind; non-loopback requires a token
    int port = 0;                    // 0: an ephemeral port (see port())
    std::string token;               // required of clients when non-empty
  };
  // Binds (SO_REUSEADDR) and starts serving; throws CommError naming the address when it
  // cannot, or when the host is not loopback and no token is given (checked before binding).
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
  // Connects to host:port, retrying until `timeout` (the server may start later); presents
  // `token`. Throws TimeoutError when no server answered in time and CommError when the
  // server rejected the token, both naming the address. `timeout` also becomes the default
  // timeout of get()/wait() and the reply deadline of the non-blocking calls.
  // One connection per object; calls from several threads are serialised.
  TcpStore(const std::string& host, int port, const std::string& token = "", Millis timeout = kDefaultTimeout);
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
