// Internal to the distributed checkpoint (sharded_save.cc, sharded_load.cc): the folder's file
// names, checked file I/O (every write, fsync and close checked; a write failure is a
// CheckpointWriteError, a read failure a CheckpointError), the row runs of a piece's box, and
// the worker threads that write and read pieces.
#pragma once

#include <algorithm>
#include <atomic>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tessel/comm/process_group.h"
#include "tessel/core/error.h"
#include "tessel/core/fault.h"
#include "tessel/core/json.h"
#include "tessel/core/tensor.h"

namespace tessel::ckpt_io {

namespace fs = std::filesystem;

inline constexpr const char* kIndexFile = "checkpoint.json";
inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr const char* kTrainerFile = "trainer.json";

std::string hex64(uint64_t v);

// Collectives over `g`; a null group is a world of one.
std::vector<std::string> gather_text(ProcessGroup* g, const std::string& mine);
bool all_ok(ProcessGroup* g, bool ok);  // true on every rank when `ok` holds on every rank

std::string sys_error();
int open_or_throw(const fs::path& path, int flags);
// TESSEL_FAULT during=save: this process fails after the fault's after_bytes more written bytes.
void arm_save_fault(const FaultSpec& fault);
void pwrite_all(int fd, const char* data, uint64_t n, uint64_t at, const std::string& path);
void pread_all(int fd, char* data, uint64_t n, uint64_t at, const std::string& path);
void fsync_or_throw(int fd, const std::string& path);
void close_or_throw(int fd, const std::string& path);
void fsync_dir(const fs::path& dir);
void write_durable(const fs::path& path, const std::string& text);  // checked through fsync and close
std::string read_text(const fs::path& path);                         // regular files only
int64_t step_of_folder(const std::string& name);                    // N of step-N, or -1
// .step-*.tmp* of killed saves, each named with its size as it goes; a folder whose owner file
// names a live process of this host (another job's save in progress) is left alone.
void remove_stale_temporaries(const fs::path& dir);
// The owner file of a save's temporary folder: this host and process (removed before publishing).
inline constexpr const char* kSaveOwnerFile = ".owner";
void write_save_owner(const fs::path& tmp);
// checkpoint_incomplete without the check that the folder holds every piece (peer_copies.h).
std::string checkpoint_files_incomplete(const std::string& step_dir);

Json shape_json(const Shape& s);
Shape json_shape(const Json& j);

// Calls fn(element index in the tensor, element index in the piece, count) for each
// contiguous run of the box (offset, extent) of a row-major tensor of `shape`, in the piece's
// row-major order.
template <typename F>
void for_each_run(const Shape& shape, const Shape& offset, const Shape& extent, F&& fn) {
  const size_t nd = shape.size();
  if (nd == 0) {
    fn(int64_t{0}, int64_t{0}, int64_t{1});
    return;
  }
  for (int64_t e : extent)
    if (e == 0) return;
  size_t k = nd - 1;  // runs cover dims k.. (dims after k whole)
  while (k > 0 && extent[k] == shape[k]) --k;
  std::vector<int64_t> stride(nd, 1);
  for (size_t d = nd - 1; d > 0; --d) stride[d - 1] = stride[d] * shape[d];
  const int64_t run = extent[k] * stride[k];
  std::vector<int64_t> idx(k, 0);
  int64_t piece_at = 0;
  while (true) {
    int64_t at = offset[k] * stride[k];
    for (size_t d = 0; d < k; ++d) at += (offset[d] + idx[d]) * stride[d];
    fn(at, piece_at, run);
    piece_at += run;
    size_t d = k;
    while (d > 0) {
      --d;
      if (++idx[d] < extent[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (k == 0) return;
  }
}

// This rank's box of `value` (whole for a plain tensor); false when it holds no piece.
bool box_of(const Tensor& value, Shape& offset, Shape& extent, Tensor& piece);

// Runs tasks 0..n-1 on up to `threads` threads; the first error is rethrown.
template <typename F>
void run_parallel(size_t n, int threads, F&& task) {
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex mu;
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        task(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        next = n;
      }
    }
  };
  const size_t t = std::min<size_t>(n, static_cast<size_t>(std::max(1, threads)));
  std::vector<std::thread> pool;
  for (size_t i = 1; i < t; ++i) pool.emplace_back(worker);
  worker();
  for (std::thread& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

// Open file descriptors by path, shared by threads.
class FdCache {
 public:
  FdCache(int flags) : flags_(flags) {}
  ~FdCache() {
    for (auto& [path, fd] : fds_) ::close(fd);
  }
  int get(const std::string& path) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = fds_.find(path);
    if (it != fds_.end()) return it->second;
    const int fd = open_or_throw(path, flags_);
    fds_[path] = fd;
    return fd;
  }
  // fsyncs (when writing) and closes every file, checked; the first failure is thrown after
  // every file is closed.
  void finish(bool sync) {
    std::lock_guard<std::mutex> lock(mu_);
    std::string error;
    for (const auto& [path, fd] : fds_) {
      if (sync && error.empty() && ::fsync(fd) != 0) error = fmt::format("fsync of '{}' failed: {}", path, sys_error());
      if (::close(fd) != 0 && error.empty()) error = fmt::format("closing '{}' failed: {}", path, sys_error());
    }
    fds_.clear();
    TESSEL_CHECK_AS(CheckpointWriteError, error.empty(), "checkpoint: {}", error);
  }

 private:
  int flags_;
  std::mutex mu_;
  std::map<std::string, int> fds_;
};

}  // namespace tessel::ckpt_io
