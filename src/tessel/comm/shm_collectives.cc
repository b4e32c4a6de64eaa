// Collectives through a shared-memory segment (see shm_collectives.h).
#include "tessel/comm/shm_collectives.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessel/comm/reduce.h"
#include "tessel/comm/spin.h"
#include "tessel/core/shape.h"
#include "tessel/core/error.h"

namespace tessel {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMagic = 0x7465737365'6c5348ULL;  // "tesselSH"
constexpr size_t kLine = 64;
constexpr size_t kDefaultSlotBytes = size_t{4} << 20;
// How long a waiter polls before it sleeps on the futex when the processes on this node outnumber
// its cores: a partner in the same phase arrives within microseconds, and a longer poll would take
// the core from one that is still computing. When each process has a core, a barrier polls for
// kSpinBudget (comm/spin.h): waking a sleeper on a virtual machine can take far longer than the
// wait itself — with 50 µs, 2 processes on 2 cores ran a data-parallel step of
// configs/bench-gpt2.yaml 6-15% slower than 2 thread ranks (alternating 30-step runs), with 5 ms 1-5%.
constexpr std::chrono::microseconds kShmSpin{50};
// Sleeps are sliced so that a waiter notices a dead process, a rank that left and its deadline.
constexpr std::chrono::milliseconds kSleepSlice{20};
// How often a waiter asks the OS whether the ranks it waits for still run.
constexpr std::chrono::milliseconds kLookEvery{100};

// The workers a launcher started on this node (LOCAL_WORLD_SIZE; 0 without one).
int launched_workers() {
  const char* v = std::getenv("LOCAL_WORLD_SIZE");
  return v != nullptr ? std::max(0, std::atoi(v)) : 0;
}

struct Header {
  uint64_t magic;
  uint64_t token;  // rank 0's random number, published with the name: proves the
                   // mapping is the same segment
  int64_t size;
  uint64_t slot_bytes;
  alignas(kLine) uint32_t wake;      // futex word: bumped by every arrival
  alignas(kLine) uint32_t sleepers;  // waiters asleep on `wake`
  alignas(kLine) int32_t gave_up;    // 1 + the rank that failed a wait; -1 while it writes why; 0
  char why[256];                     // what the first rank to give up saw
};

size_t header_bytes(int size) { return (sizeof(Header) + kLine * static_cast<size_t>(size) + 4095) / 4096 * 4096; }

template <typename T>
std::atomic_ref<T> atomic(T& x) {
  return std::atomic_ref<T>(x);
}

void futex_wait(uint32_t* word, uint32_t seen, std::chrono::milliseconds slice) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(slice.count() / 1000);
  ts.tv_nsec = static_cast<long>((slice.count() % 1000) * 1'000'000);
  ::syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void futex_wake_all(uint32_t* word) { ::syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0); }

// Whether process `pid` has ended: no such process, or a zombie its parent has not reaped yet.
bool process_gone(int32_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::FILE* f = std::fopen(fmt::format("/proc/{}/stat", pid).c_str(), "r");
  if (f == nullptr) return false;
  char state = '?';
  // "pid (comm) S ...": the state follows the last ')' (comm may hold spaces and parentheses).
  char line[512] = {};
  const size_t got = std::fread(line, 1, sizeof line - 1, f);
  std::fclose(f);
  const char* close = std::strrchr(line, ')');
  if (got > 0 && close != nullptr && close[1] == ' ') state = close[2];
  return state == 'Z' || state == 'X';
}

size_t slot_bytes_from_env() {
  const char* v = std::getenv("TESSEL_GLOO_SHM_SLOT_BYTES");
  if (v == nullptr || *v == '\0') return kDefaultSlotBytes;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  TESSEL_CHECK(end != v && *end == '\0' && x >= 64,
               "TESSEL_GLOO_SHM_SLOT_BYTES='{}' must be a whole number of bytes, at least 64", v);
  return static_cast<size_t>(x);
}

// Rank 0's half of connect: a fresh segment of `bytes`, its pages reserved (a tmpfs without room
// fails here, not with SIGBUS at the first copy). Returns its name, or "" with `why` set.
std::string create_segment(size_t bytes, int& fd, std::string& why) {
  std::random_device rd;
  for (int attempt = 0; attempt < 8; ++attempt) {
    const std::string name = fmt::format("/tessel-{}-{:08x}{:08x}", ::getpid(), rd(), rd());
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno == EEXIST) continue;
    if (fd < 0) {
      why = fmt::format("shm_open: {}", std::strerror(errno));
      return "";
    }
    int err =
        ::ftruncate(fd, static_cast<off_t>(bytes)) != 0 ? errno : ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (err != 0) {
      why = fmt::format("reserving {} bytes of shared memory: {}", bytes, std::strerror(err));
      ::close(fd);
      ::shm_unlink(name.c_str());
      return "";
    }
    return name;
  }
  why = "shm_open: no free name";
  return "";
}

}  // namespace

struct ShmCollectives::RankLine {
  uint64_t arrived;  // barriers this rank has reached
  int32_t pid;
  int32_t left;      // 1 once the rank's group is gone
  int64_t value[2];  // max_over_ranks's exchange, alternating so a fast rank never overwrites an unread one
};

std::unique_ptr<ShmCollectives> ShmCollectives::connect(Store& store, const std::string& key, int rank, int size,
                                                        Millis timeout, const std::function<bool(bool)>& all_ok,
                                                        size_t slot_bytes, std::string* why_not) {
  if (slot_bytes == 0) slot_bytes = slot_bytes_from_env();
  // At least a cache line per member: all_to_all gives each destination a share of a slot.
  slot_bytes = std::max((slot_bytes + kLine - 1) / kLine * kLine, kLine * static_cast<size_t>(size));
  const size_t bytes = header_bytes(size) + slot_bytes * static_cast<size_t>(size + 1);
  std::string name, why;
  static_assert(sizeof(RankLine) <= kLine);
  void* base = MAP_FAILED;
  auto map = [&](int fd) {
    if (fd < 0) return;
    base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) why = fmt::format("mmap: {}", std::strerror(errno));
    ::close(fd);
  };
  if (rank == 0) {
    // The header is complete before the name is published.
    int fd = -1;
    name = create_segment(bytes, fd, why);
    if (!name.empty()) map(fd);
    const uint64_t token = std::random_device{}() * uint64_t{0x100000001};
    if (base != MAP_FAILED) {
      auto* h = static_cast<Header*>(base);
      std::memset(base, 0, header_bytes(size));
      h->magic = kMagic;
      h->token = token;
      h->size = size;
      h->slot_bytes = slot_bytes;
    }
    store.set(key, base == MAP_FAILED ? std::string() : fmt::format("{} {}", name, token));
  } else {
    const std::string published = store.get(key, timeout);
    const size_t space = published.find(' ');
    if (space != std::string::npos) {
      const std::string theirs = published.substr(0, space);
      const uint64_t token = std::stoull(published.substr(space + 1));
      const int fd = ::shm_open(theirs.c_str(), O_RDWR, 0600);
      if (fd < 0) why = fmt::format("shm_open {}: {}", theirs, std::strerror(errno));
      map(fd);
      // Some other segment of that name (a member on another host, with its own /dev/shm) fails
      // here.
      if (base != MAP_FAILED) {
        const auto* h = static_cast<const Header*>(base);
        if (h->magic != kMagic || h->token != token || h->size != size || h->slot_bytes != slot_bytes) {
          why = fmt::format("{} is not this group's segment", theirs);
          ::munmap(base, bytes);
          base = MAP_FAILED;
        }
      }
    }
  }
  const bool ok = base != MAP_FAILED;
  // Whatever the others found, everyone has opened the name by now (or never will): unlink it.
  bool everyone = false;
  try {
    everyone = all_ok(ok);
  } catch (...) {  // the group failed (a member never came): leave nothing behind
    if (rank == 0 && !name.empty()) ::shm_unlink(name.c_str());
    if (base != MAP_FAILED) ::munmap(base, bytes);
    throw;
  }
  if (rank == 0 && !name.empty()) ::shm_unlink(name.c_str());
  if (!everyone) {
    if (base != MAP_FAILED) ::munmap(base, bytes);
    if (why_not != nullptr) *why_not = ok ? "another member could not map the segment" : why;
    return nullptr;
  }
  std::unique_ptr<ShmCollectives> c(new ShmCollectives(base, bytes, rank, size, slot_bytes, timeout));
  c->line(rank).pid = static_cast<int32_t>(::getpid());
  c->barrier();  // every pid is written
  return c;
}

ShmCollectives::ShmCollectives(void* base, size_t bytes, int rank, int size, size_t slot_bytes, Millis timeout)
    : base_(base),
      bytes_(bytes),
      rank_(rank),
      size_(size),
      slot_bytes_(slot_bytes),
      timeout_(timeout),
      // The processes computing on this node: the launcher's LOCAL_WORLD_SIZE where it is larger
      // than this group (a tp group inside a node of dp x tp processes).
      spin_(spin_budget(std::max(size, launched_workers()), kShmSpin)) {}

ShmCollectives::~ShmCollectives() {
  auto* h = static_cast<Header*>(base_);
  atomic(line(rank_).left).store(1, std::memory_order_release);
  atomic(h->wake).fetch_add(1);
  futex_wake_all(&h->wake);
  ::munmap(base_, bytes_);
}

ShmCollectives::RankLine& ShmCollectives::line(int r) const {
  return *reinterpret_cast<RankLine*>(static_cast<char*>(base_) + sizeof(Header) + kLine * static_cast<size_t>(r));
}

char* ShmCollectives::slot(int r) const {
  return static_cast<char*>(base_) + header_bytes(size_) + slot_bytes_ * static_cast<size_t>(r);
}

void ShmCollectives::fail(const std::string& why, bool timed_out) {
  auto* h = static_cast<Header*>(base_);
  int32_t none = 0;
  if (atomic(h->gave_up).compare_exchange_strong(none, -1)) {  // the first to give up says why
    const size_t n = std::min(why.size(), sizeof h->why - 1);
    std::memcpy(h->why, why.data(), n);
    h->why[n] = '\0';
    atomic(h->gave_up).store(rank_ + 1, std::memory_order_release);
  }
  atomic(h->wake).fetch_add(1);
  futex_wake_all(&h->wake);
  if (timed_out) throw TimeoutError(why);
  throw CommError(why);
}

void ShmCollectives::sync() {
  auto* h = static_cast<Header*>(base_);
  const uint64_t e = ++epoch_;
  atomic(line(rank_).arrived).store(e, std::memory_order_release);
  atomic(h->wake).fetch_add(1);
  if (atomic(h->sleepers).load() > 0) futex_wake_all(&h->wake);

  auto ready = [&] {
    for (int r = 0; r < size_; ++r)
      if (atomic(line(r).arrived).load(std::memory_order_acquire) < e) return false;
    return true;
  };
  if (spin_until(ready, spin_)) return;
  const auto deadline = Clock::now() + timeout_;
  auto next_look = Clock::now();
  for (;;) {
    const uint32_t seen = atomic(h->wake).load();
    if (ready()) return;
    std::vector<int> missing;
    for (int r = 0; r < size_; ++r)
      if (atomic(line(r).arrived).load(std::memory_order_acquire) < e) missing.push_back(r);
    const auto now = Clock::now();
    const bool look = now >= next_look;  // /proc at most every kLookEvery, not at every wake-up
    if (look) next_look = now + kLookEvery;
    for (int r : missing) {
      if (atomic(line(r).left).load(std::memory_order_acquire) != 0)
        fail(fmt::format("group rank {} left the group (it failed) before this collective's shared-memory barrier", r));
      const int32_t pid = line(r).pid;
      if (look && process_gone(pid)) fail(fmt::format("group rank {}'s process (pid {}) is gone", r, pid));
    }
    if (const int32_t g = atomic(h->gave_up).load(std::memory_order_acquire); g > 0)
      fail(fmt::format("group rank {} gave up on a shared-memory collective: {}", g - 1, std::string(h->why)));
    if (Clock::now() >= deadline) {
      fail(fmt::format("timed out after {} ms at a shared-memory barrier waiting for group ranks [{}]",
                       timeout_.count(), fmt::join(missing, ", ")),
           true);
    }
    atomic(h->sleepers).fetch_add(1);
    if (!ready()) futex_wait(&h->wake, seen, kSleepSlice);
    atomic(h->sleepers).fetch_sub(1);
  }
}

void ShmCollectives::barrier() { sync(); }

void ShmCollectives::all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op) {
  reduce_to(buf, count, dtype, op, -1);
}

void ShmCollectives::reduce(void* buf, int64_t count, DType dtype, ReduceOp op, int root) {
  reduce_to(buf, count, dtype, op, root);
}

void ShmCollectives::reduce_to(void* buf, int64_t count, DType dtype, ReduceOp op, int root) {
  const size_t esz = dtype_size(dtype);
  const int64_t chunk = static_cast<int64_t>(slot_bytes_ / esz);
  std::vector<const void*> srcs;
  for (int r = 0; r < size_; ++r) srcs.push_back(slot(r));
  for (int64_t at = 0; at < count; at += chunk) {
    const int64_t n = std::min(chunk, count - at);
    char* mine = static_cast<char*>(buf) + static_cast<size_t>(at) * esz;
    std::memcpy(slot(rank_), mine, static_cast<size_t>(n) * esz);
    sync();
    // Each rank reduces its share, in whole cache lines, into the result slot.
    const int64_t per_line = static_cast<int64_t>(kLine / std::min(esz, kLine));
    const int64_t lines = (n + per_line - 1) / per_line;
    const int64_t lo = std::min(n, split_offset(lines, size_, rank_) * per_line);
    const int64_t hi = std::min(n, lo + split_size(lines, size_, rank_) * per_line);
    if (hi > lo) reduce_ranks(srcs, {slot(size_)}, lo, lo, hi - lo, dtype, op);
    sync();
    if (root < 0 || root == rank_) std::memcpy(mine, slot(size_), static_cast<size_t>(n) * esz);
  }
}

void ShmCollectives::broadcast(void* buf, int64_t count, DType dtype, int root) {
  const size_t esz = dtype_size(dtype);
  const int64_t chunk = static_cast<int64_t>(slot_bytes_ * static_cast<size_t>(size_) / esz);
  for (int64_t at = 0; at < count; at += chunk) {
    const size_t bytes = static_cast<size_t>(std::min(chunk, count - at)) * esz;
    char* part = static_cast<char*>(buf) + static_cast<size_t>(at) * esz;
    if (rank_ == root) std::memcpy(slot(0), part, bytes);
    sync();
    if (rank_ != root) std::memcpy(part, slot(0), bytes);
    sync();
  }
}

// The output, concatenated, in windows of the input slots together: each rank writes the part of
// its piece that falls in the window, then everyone copies the window out.
void ShmCollectives::all_gather_v(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype) {
  gather_to(in, out, counts, dtype, -1);
}

void ShmCollectives::gather(const void* in, void* out, int64_t count, DType dtype, int root) {
  gather_to(in, out, std::vector<int64_t>(static_cast<size_t>(size_), count), dtype, root);
}

void ShmCollectives::gather_to(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype, int root) {
  const size_t esz = dtype_size(dtype);
  std::vector<int64_t> displ(counts.size() + 1, 0);
  for (size_t r = 0; r < counts.size(); ++r) displ[r + 1] = displ[r] + counts[r];
  const int64_t total = displ.back(), window = static_cast<int64_t>(slot_bytes_ * static_cast<size_t>(size_) / esz);
  const int64_t mine_lo = displ[static_cast<size_t>(rank_)], mine_hi = displ[static_cast<size_t>(rank_) + 1];
  for (int64_t w = 0; w < total; w += window) {
    const int64_t w_hi = std::min(total, w + window);
    const int64_t lo = std::max(w, mine_lo), hi = std::min(w_hi, mine_hi);
    if (hi > lo)
      std::memcpy(slot(0) + static_cast<size_t>(lo - w) * esz,
                  static_cast<const char*>(in) + static_cast<size_t>(lo - mine_lo) * esz,
                  static_cast<size_t>(hi - lo) * esz);
    sync();
    if (root < 0 || root == rank_)
      std::memcpy(static_cast<char*>(out) + static_cast<size_t>(w) * esz, slot(0), static_cast<size_t>(w_hi - w) * esz);
    sync();
  }
}

// The input in windows of one slot: every rank copies its window into its slot, then reduces the
// part of its own segment in the window straight into its output.
void ShmCollectives::reduce_scatter_v(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype,
                                      ReduceOp op) {
  const size_t esz = dtype_size(dtype);
  int64_t total = 0, mine_lo = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) mine_lo = total;
    total += counts[static_cast<size_t>(r)];
  }
  const int64_t mine_hi = mine_lo + counts[static_cast<size_t>(rank_)];
  const int64_t window = static_cast<int64_t>(slot_bytes_ / esz);
  std::vector<const void*> srcs;
  for (int r = 0; r < size_; ++r) srcs.push_back(slot(r));
  for (int64_t w = 0; w < total; w += window) {
    const int64_t w_hi = std::min(total, w + window);
    std::memcpy(slot(rank_), static_cast<const char*>(in) + static_cast<size_t>(w) * esz,
                static_cast<size_t>(w_hi - w) * esz);
    sync();
    const int64_t lo = std::max(w, mine_lo), hi = std::min(w_hi, mine_hi);
    if (hi > lo) reduce_ranks(srcs, {out}, lo - w, lo - mine_lo, hi - lo, dtype, op);
    sync();
  }
}

// Root's input in windows of the input slots together; every rank copies its part of each window.
void ShmCollectives::scatter(const void* in, void* out, int64_t count, DType dtype, int root) {
  const size_t esz = dtype_size(dtype);
  const int64_t total = count * size_, window = static_cast<int64_t>(slot_bytes_ * static_cast<size_t>(size_) / esz);
  const int64_t mine_lo = count * rank_, mine_hi = mine_lo + count;
  for (int64_t w = 0; w < total; w += window) {
    const int64_t w_hi = std::min(total, w + window);
    if (rank_ == root)
      std::memcpy(slot(0), static_cast<const char*>(in) + static_cast<size_t>(w) * esz,
                  static_cast<size_t>(w_hi - w) * esz);
    sync();
    const int64_t lo = std::max(w, mine_lo), hi = std::min(w_hi, mine_hi);
    if (hi > lo)
      std::memcpy(static_cast<char*>(out) + static_cast<size_t>(lo - mine_lo) * esz,
                  slot(0) + static_cast<size_t>(lo - w) * esz, static_cast<size_t>(hi - lo) * esz);
    sync();
  }
}

int64_t ShmCollectives::max_over_ranks(int64_t mine) {
  const size_t which = static_cast<size_t>(epoch_ % 2);
  atomic(line(rank_).value[which]).store(mine, std::memory_order_relaxed);
  sync();  // publishes the values (the arrival counts are release/acquire)
  int64_t most = mine;
  for (int r = 0; r < size_; ++r) most = std::max(most, atomic(line(r).value[which]).load(std::memory_order_relaxed));
  return most;
}

// In rounds: each rank's slot is cut into one share per destination; in round k a rank writes the
// k-th share-sized piece of its segment for every destination, and after a barrier every rank
// copies the pieces meant for it out of every slot. There are as many rounds as the longest segment
// between any two ranks needs (agreed through the header first).
void ShmCollectives::all_to_all_v(const void* in, const std::vector<int64_t>& send_counts, void* out,
                                  const std::vector<int64_t>& recv_counts, DType dtype) {
  const size_t esz = dtype_size(dtype);
  const int64_t share = static_cast<int64_t>(slot_bytes_ / static_cast<size_t>(size_) / esz);
  std::vector<int64_t> sdispl(static_cast<size_t>(size_), 0), rdispl(static_cast<size_t>(size_), 0);
  int64_t longest = 0;
  for (size_t u = 0; u < static_cast<size_t>(size_); ++u) {
    if (u > 0) {
      sdispl[u] = sdispl[u - 1] + send_counts[u - 1];
      rdispl[u] = rdispl[u - 1] + recv_counts[u - 1];
    }
    longest = std::max({longest, send_counts[u], recv_counts[u]});
  }
  const int64_t rounds = (max_over_ranks(longest) + share - 1) / share;
  auto piece = [&](int64_t n, int64_t k) { return std::clamp<int64_t>(n - k * share, 0, share); };
  for (int64_t k = 0; k < rounds; ++k) {
    for (int d = 0; d < size_; ++d) {
      const size_t u = static_cast<size_t>(d);
      if (const int64_t n = piece(send_counts[u], k); n > 0)
        std::memcpy(slot(rank_) + static_cast<size_t>(d * share) * esz,
                    static_cast<const char*>(in) + static_cast<size_t>(sdispl[u] + k * share) * esz,
                    static_cast<size_t>(n) * esz);
    }
    sync();
    for (int src = 0; src < size_; ++src) {
      const size_t u = static_cast<size_t>(src);
      if (const int64_t n = piece(recv_counts[u], k); n > 0)
        std::memcpy(static_cast<char*>(out) + static_cast<size_t>(rdispl[u] + k * share) * esz,
                    slot(src) + static_cast<size_t>(rank_ * share) * esz, static_cast<size_t>(n) * esz);
    }
    sync();
  }
}

}  // namespace tessel
