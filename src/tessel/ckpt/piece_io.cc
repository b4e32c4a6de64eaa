// The file, geometry and thread helpers the distributed checkpoint's save and load share.
#include "tessel/ckpt/piece_io.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>

#include "tessel/core/log.h"
#include "tessel/dist/dtensor.h"
#include "tessel/dist/mesh_comm.h"

namespace tessel::ckpt_io {

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

// ---- collectives (a null group is a world of one) ----

std::vector<std::string> gather_text(ProcessGroup* g, const std::string& mine) {
  if (g == nullptr || g->size() == 1) return {mine};
  return all_gather_strings(*g, mine);
}

// True on every rank when `ok` holds on every rank.
bool all_ok(ProcessGroup* g, bool ok) {
  if (g == nullptr || g->size() == 1) return ok;
  int64_t bad = ok ? 0 : 1;
  g->all_reduce(&bad, 1, DType::i64, ReduceOp::sum);
  return bad == 0;
}

// ---- files ----

std::string sys_error() { return std::strerror(errno); }

int open_or_throw(const fs::path& path, int flags) {
  int fd;
  do fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  while (fd < 0 && errno == EINTR);
  if (fd >= 0) return fd;
  const std::string what = fmt::format("checkpoint: cannot open '{}': {}", path.string(), sys_error());
  // Failing to write is a failed run (exit 1); failing to read, a checkpoint to fix (exit 2).
  if ((flags & O_ACCMODE) == O_RDONLY && (flags & O_DIRECTORY) == 0) throw CheckpointError(what);
  throw CheckpointWriteError(what);
}

// An injected failure part-way through a save (TESSEL_FAULT during=save): the bytes this
// process may still write before it fails; negative when none is armed.
namespace {
std::atomic<int64_t> g_fault_budget{-1};
std::optional<FaultSpec> g_fault;
std::mutex g_fault_mu;
}  // namespace

void arm_save_fault(const FaultSpec& fault) {
  std::lock_guard<std::mutex> lock(g_fault_mu);
  g_fault = fault;
  g_fault_budget = fault.after_bytes;
}

namespace {

// Writes what the budget allows, then fails as the spec says.
void spend_fault_budget(int fd, const char*& data, uint64_t& n, uint64_t& at) {
  if (g_fault_budget.load() < 0) return;
  const int64_t left = g_fault_budget.fetch_sub(static_cast<int64_t>(n));
  if (left >= static_cast<int64_t>(n)) return;
  const uint64_t part = left > 0 ? static_cast<uint64_t>(left) : 0;
  if (part > 0) (void)!::pwrite(fd, data, part, static_cast<off_t>(at));
  std::lock_guard<std::mutex> lock(g_fault_mu);
  if (g_fault) inject_fault(*g_fault);
}

}  // namespace

void pwrite_all(int fd, const char* data, uint64_t n, uint64_t at, const std::string& path) {
  spend_fault_budget(fd, data, n, at);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, data, std::min<uint64_t>(n, uint64_t{1} << 30), static_cast<off_t>(at));
    if (w < 0 && errno == EINTR) continue;
    TESSEL_CHECK_AS(CheckpointWriteError, w > 0, "checkpoint: writing '{}' failed: {}", path,
                    w < 0 ? sys_error() : "no progress");
    data += w;
    n -= static_cast<uint64_t>(w);
    at += static_cast<uint64_t>(w);
  }
}

void pread_all(int fd, char* data, uint64_t n, uint64_t at, const std::string& path) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, data, std::min<uint64_t>(n, uint64_t{1} << 30), static_cast<off_t>(at));
    if (r < 0 && errno == EINTR) continue;
    TESSEL_CHECK_AS(CheckpointError, r > 0, "checkpoint: reading '{}' failed: {}", path,
                    r < 0 ? sys_error() : "the file ends early");
    data += r;
    n -= static_cast<uint64_t>(r);
    at += static_cast<uint64_t>(r);
  }
}

void fsync_or_throw(int fd, const std::string& path) {
  TESSEL_CHECK_AS(CheckpointWriteError, ::fsync(fd) == 0, "checkpoint: fsync of '{}' failed: {}", path, sys_error());
}

void close_or_throw(int fd, const std::string& path) {
  TESSEL_CHECK_AS(CheckpointWriteError, ::close(fd) == 0, "checkpoint: closing '{}' failed: {}", path, sys_error());
}

void fsync_dir(const fs::path& dir) {
  const int fd = open_or_throw(dir, O_RDONLY | O_DIRECTORY);
  const int rc = ::fsync(fd);
  const std::string err = rc == 0 ? "" : sys_error();
  ::close(fd);
  TESSEL_CHECK_AS(CheckpointWriteError, rc == 0, "checkpoint: fsync of folder '{}' failed: {}", dir.string(), err);
}

// Writes `text` to `path`, checked through fsync and close.
void write_durable(const fs::path& path, const std::string& text) {
  const int fd = open_or_throw(path, O_WRONLY | O_CREAT | O_TRUNC);
  try {
    pwrite_all(fd, text.data(), text.size(), 0, path.string());
    fsync_or_throw(fd, path.string());
  } catch (...) {
    ::close(fd);
    throw;
  }
  close_or_throw(fd, path.string());
}

std::string read_text(const fs::path& path) {
  TESSEL_CHECK_AS(CheckpointError, fs::is_regular_file(path), "checkpoint: '{}' is not a regular file", path.string());
  std::ifstream in(path, std::ios::binary);
  TESSEL_CHECK_AS(CheckpointError, in.good(), "checkpoint: cannot read '{}'", path.string());
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// N of a folder named step-N (digits only), or -1.
int64_t step_of_folder(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() == 5) return -1;
  int64_t step = 0;
  auto [end, ec] = std::from_chars(name.data() + 5, name.data() + name.size(), step);
  return ec == std::errc() && end == name.data() + name.size() ? step : -1;
}

namespace {

std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "?";
  return host;
}

// Whether the save that wrote `tmp`'s owner file is still running: a live process of this host
// other than this one. A folder without one (an older save, or one killed before writing it)
// or of another host counts as left over.
bool owner_alive(const fs::path& tmp) {
  std::ifstream in(tmp / kSaveOwnerFile);
  std::string host;
  long long pid = 0;
  if (!(in >> host >> pid) || host != host_name() || pid <= 0 || pid == ::getpid()) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

int64_t bytes_under(const fs::path& dir) {
  int64_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    std::error_code size_ec;
    if (it->is_regular_file(size_ec)) {
      const auto size = it->file_size(size_ec);
      if (!size_ec) n += static_cast<int64_t>(size);
    }
  }
  return n;
}

}  // namespace

void write_save_owner(const fs::path& tmp) {
  write_durable(tmp / kSaveOwnerFile, fmt::format("{} {}\n", host_name(), static_cast<long long>(::getpid())));
}

// Temporary folders of saves that never finished (this format's and the older per-process one).
void remove_stale_temporaries(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(".step-", 0) != 0 || name.find(".tmp") == std::string::npos) continue;
    if (owner_alive(entry.path())) {
      log_info("left the checkpoint folder {} alone: a save of process {} on this host is writing it",
               entry.path().string(), read_text(entry.path() / kSaveOwnerFile));
      continue;
    }
    const int64_t bytes = bytes_under(entry.path());
    std::error_code rm;
    fs::remove_all(entry.path(), rm);
    log_info("removed {} ({:.2f} GB), left by a save that did not finish{}", entry.path().string(),
             static_cast<double>(bytes) / 1e9, rm ? fmt::format(" (not all of it: {})", rm.message()) : "");
  }
}

Json shape_json(const Shape& s) {
  Json::Array a;
  for (int64_t v : s) a.emplace_back(v);
  return Json(std::move(a));
}

Shape json_shape(const Json& j) {
  Shape s;
  for (const Json& v : j.as_array()) s.push_back(v.as_int());
  return s;
}

// This rank's box of `value` (whole for a plain tensor); false when it holds no piece.
bool box_of(const Tensor& value, Shape& offset, Shape& extent, Tensor& piece) {
  if (!is_dist(value)) {
    offset.assign(value.shape().size(), 0);
    extent = value.shape();
    piece = value;
    return true;
  }
  const DistAttr& a = dist_attr(value);
  const int64_t rank = current_world_rank();
  if (!a.mesh.contains(rank)) return false;
  TESSEL_CHECK_AS(CheckpointError, !a.has_partial(), "checkpoint: a Partial tensor ({}) has no piece to save or load",
                  a.str());
  offset = a.local_offset(value.shape(), rank);
  piece = local_piece(value);
  extent = piece.shape();
  return true;
}

}  // namespace tessel::ckpt_io

namespace tessel {
void remove_unfinished_saves(const std::string& dir) { ckpt_io::remove_stale_temporaries(ckpt_io::fs::path(dir)); }
}  // namespace tessel
