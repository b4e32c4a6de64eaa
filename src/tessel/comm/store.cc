// In-memory and prefix stores.
#include "tessel/comm/store.h"

#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "tessel/core/error.h"

namespace tessel {

namespace {
std::atomic<int64_t> g_default_timeout_ms{-1};  // -1: not decided yet
}  // namespace

Millis timeout_from_seconds(double seconds, const std::string& what) {
  TESSEL_CHECK(std::isfinite(seconds) && seconds > 0 && seconds <= 1e6,
               "{}: the timeout must be a positive number of seconds up to 1000000, got {}", what, seconds);
  return Millis(std::max<int64_t>(1, std::llround(seconds * 1000)));
}

Millis parse_timeout_seconds(const std::string& text, const std::string& what) {
  double v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  TESSEL_CHECK(ec == std::errc() && p == text.data() + text.size() && !text.empty(),
               "{}: '{}' is not a number of seconds", what, text);
  return timeout_from_seconds(v, what);
}

Millis default_timeout() {
  int64_t ms = g_default_timeout_ms.load();
  if (ms < 0) {
    const char* env = std::getenv("TESSEL_TIMEOUT_S");
    ms = env != nullptr && *env != '\0' ? parse_timeout_seconds(env, "environment variable TESSEL_TIMEOUT_S").count()
                                        : kDefaultTimeout.count();
    int64_t unset = -1;
    g_default_timeout_ms.compare_exchange_strong(unset, ms);
    ms = g_default_timeout_ms.load();
  }
  return Millis(ms);
}

void set_default_timeout(Millis timeout) {
  TESSEL_CHECK(timeout.count() > 0, "set_default_timeout: the timeout must be positive, got {} ms", timeout.count());
  g_default_timeout_ms = timeout.count();
}

namespace {
std::string missing_keys(const std::map<std::string, std::string>& data, const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& k : keys)
    if (!data.count(k)) out += (out.empty() ? "" : ", ") + k;
  return out;
}
}  // namespace

void MemoryStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard lock(mutex_);
    data_[key] = value;
  }
  changed_.notify_all();
}

std::string MemoryStore::get(const std::string& key, Millis timeout) {
  wait({key}, timeout);
  std::lock_guard lock(mutex_);
  return data_.at(key);
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t v = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = data_.find(key);
    if (it != data_.end()) {
      auto [p, ec] = std::from_chars(it->second.data(), it->second.data() + it->second.size(), v);
      TESSEL_CHECK(ec == std::errc(), "store add: key '{}' holds '{}', not an integer", key, it->second);
    }
    v += delta;
    data_[key] = std::to_string(v);
  }
  changed_.notify_all();
  return v;
}

void MemoryStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  std::unique_lock lock(mutex_);
  auto all = [&] {
    for (const std::string& k : keys)
      if (!data_.count(k)) return false;
    return true;
  };
  if (!changed_.wait_for(lock, timeout, all))
    TESSEL_CHECK_AS(TimeoutError, false, "store: timed out after {} ms waiting for keys [{}]", timeout.count(),
                    missing_keys(data_, keys));
}

std::string MemoryStore::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  std::string result;
  {
    std::lock_guard lock(mutex_);
    auto it = data_.find(key);
    if ((it == data_.end() && expected.empty()) || (it != data_.end() && it->second == expected)) {
      data_[key] = desired;
      result = desired;
    } else {
      result = it == data_.end() ? "" : it->second;
    }
  }
  changed_.notify_all();
  return result;
}

bool MemoryStore::remove(const std::string& key) {
  std::lock_guard lock(mutex_);
  return data_.erase(key) > 0;
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  for (const std::string& k : keys)
    if (!data_.count(k)) return false;
  return true;
}

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base) : prefix_(std::move(prefix)), base_(std::move(base)) {
  timeout_ = base_->timeout();
}

std::vector<std::string> PrefixStore::keys(const std::vector<std::string>& ks) const {
  std::vector<std::string> out;
  for (const std::string& k : ks) out.push_back(key(k));
  return out;
}

void PrefixStore::set(const std::string& k, const std::string& v) { base_->set(key(k), v); }
std::string PrefixStore::get(const std::string& k, Millis t) { return base_->get(key(k), t); }
int64_t PrefixStore::add(const std::string& k, int64_t d) { return base_->add(key(k), d); }
void PrefixStore::wait(const std::vector<std::string>& ks, Millis t) { base_->wait(keys(ks), t); }
std::string PrefixStore::compare_set(const std::string& k, const std::string& e, const std::string& d) {
  return base_->compare_set(key(k), e, d);
}
bool PrefixStore::remove(const std::string& k) { return base_->remove(key(k)); }
bool PrefixStore::check(const std::vector<std::string>& ks) { return base_->check(keys(ks)); }

}  // namespace tessel
