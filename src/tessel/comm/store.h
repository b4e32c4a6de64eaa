// Store: the key-value service that ranks use to find each other (rendezvous) and that the
// launcher uses to coordinate nodes. Every blocking call has a timeout and throws
// TimeoutError naming the keys it waited for. MemoryStore serves ranks that are threads of
// one process; TcpStore (tcp_store.h) serves processes on one or many machines.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tessel {

using Millis = std::chrono::milliseconds;
inline constexpr Millis kDefaultTimeout{300'000};

// The timeout of every collective, send/recv and store call that is not given one: the last
// set_default_timeout(), else $TESSEL_TIMEOUT_S (seconds; `tessel launch --timeout` sets it for
// its processes), else kDefaultTimeout. Process-wide: `tessel train` sets it from --timeout or
// the config's parallel.timeout_s before any rank starts. Throws Error naming the variable
// when TESSEL_TIMEOUT_S is not a positive number.
Millis default_timeout();
void set_default_timeout(Millis timeout);
// "SECONDS" (a positive, finite number of seconds, at most a million) as Millis; throws Error
// naming `what` (a flag, key or variable) otherwise.
Millis parse_timeout_seconds(const std::string& text, const std::string& what);
Millis timeout_from_seconds(double seconds, const std::string& what);

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;
  // The value of `key`, waiting until it is set; TimeoutError after `timeout`.
  virtual std::string get(const std::string& key, Millis timeout) = 0;
  // Adds `delta` to the integer at `key` (absent counts as 0) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Waits until every key is set; TimeoutError naming the missing ones.
  virtual void wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  // Sets `key` to `desired` when its value equals `expected` ("" also matches an absent key)
  // and returns the value it holds afterwards.
  virtual std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) = 0;
  // Deletes `key`; returns whether it existed.
  virtual bool remove(const std::string& key) = 0;
  // Whether every key is set, without waiting.
  virtual bool check(const std::vector<std::string>& keys) = 0;

  std::string get(const std::string& key) { return get(key, timeout_); }
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }
  Millis timeout() const { return timeout_; }
  void set_timeout(Millis t) { timeout_ = t; }

 protected:
  Millis timeout_ = default_timeout();
};

// A store in this process's memory (thread ranks, tests).
class MemoryStore final : public Store {
 public:
  using Store::get;
  using Store::wait;
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) override;
  bool remove(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> data_;
};

// Prefixes every key with "<prefix>/" (groups and jobs sharing one store).
class PrefixStore final : public Store {
 public:
  using Store::get;
  using Store::wait;
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) override;
  bool remove(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;

 private:
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  std::vector<std::string> keys(const std::vector<std::string>& ks) const;
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace tessel
