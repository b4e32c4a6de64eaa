// Distributed checkpoints: shared safetensors files written and read piece by piece.
#include "tessel/ckpt/sharded.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "tessel/ckpt/safetensors.h"
#include "tessel/core/fault.h"
#include "tessel/core/log.h"
#include "tessel/core/view.h"
#include "tessel/dist/dtensor.h"
#include "tessel/dist/mesh_comm.h"
#include "tessel/ops/elementwise.h"
#include "tessel/ops/inplace.h"

namespace tessel {

namespace fs = std::filesystem;

namespace {

constexpr const char* kIndexFile = "checkpoint.json";
constexpr const char* kManifestFile = "manifest.json";
constexpr const char* kTrainerFile = "trainer.json";

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
std::atomic<int64_t> g_fault_budget{-1};
std::optional<FaultSpec> g_fault;
std::mutex g_fault_mu;

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

// Temporary folders of saves that never finished (this format's and the older per-process one).
void remove_stale_temporaries(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(".step-", 0) == 0 && name.find(".tmp") != std::string::npos) {
      std::error_code rm;
      fs::remove_all(entry.path(), rm);
      log_info("removed the unfinished checkpoint folder {}", entry.path().string());
    }
  }
}

// ---- geometry ----

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

// ---- the save plan every rank computes alike ----

struct PieceRef {
  int rank = 0;
  Shape offset, extent;
};

struct TensorPlan {
  std::string group, name, dtype, placements;
  Shape shape, file_shape;  // the value's (pieces are in its coordinates) and the files'
  std::vector<PieceRef> pieces;
  size_t file = 0;       // index into the file list
  uint64_t begin = 0;    // in the file's data section
  uint64_t bytes() const { return static_cast<uint64_t>(shape_numel(shape)) * safetensors_dtype_size(dtype); }
};

struct FilePlan {
  std::string group, name;
  std::vector<size_t> tensors;  // indices into the tensor plans, in name order
  std::string header;
  uint64_t size = 0;
};

Json describe_local(const CheckpointContent& content) {
  Json::Array out;
  for (const auto& [group, tensors] : content.groups)
    for (const CheckpointTensor& t : tensors) {
      TESSEL_CHECK_AS(CheckpointError, t.value.defined(), "checkpoint: tensor \"{}\" is undefined", t.name);
      Shape offset, extent;
      Tensor piece;
      try {
        (void)box_of(t.value, offset, extent, piece);
      } catch (const std::exception& e) {
        throw CheckpointError(fmt::format("tensor \"{}\": {}", t.name, e.what()));
      }
      Json j = Json::Object{};
      j["g"] = group;
      j["n"] = t.name;
      j["dt"] = safetensors_dtype(t.value.dtype());
      j["s"] = shape_json(t.value.shape());
      j["fs"] = shape_json(t.file_shape.empty() ? t.value.shape() : t.file_shape);
      j["pl"] = is_dist(t.value) ? dist_attr(t.value).str() : std::string("whole");
      if (box_of(t.value, offset, extent, piece)) {
        j["o"] = shape_json(offset);
        j["e"] = shape_json(extent);
      }
      out.push_back(std::move(j));
    }
  return Json(std::move(out));
}

// Merges every rank's description: one plan per tensor, replicas dropped (the lowest rank
// holding a box writes it), files laid out.
void make_plan(const std::vector<std::string>& described, std::vector<TensorPlan>& plans, std::vector<FilePlan>& files,
               int world) {
  std::map<std::string, TensorPlan> by_name;
  for (size_t r = 0; r < described.size(); ++r) {
    const Json all = Json::parse(described[r]);
    for (const Json& j : all.as_array()) {
      const std::string name = j.at("n").as_string();
      TensorPlan want;
      want.group = j.at("g").as_string();
      want.name = name;
      want.dtype = j.at("dt").as_string();
      want.placements = j.at("pl").as_string();
      want.shape = json_shape(j.at("s"));
      want.file_shape = json_shape(j.at("fs"));
      TESSEL_CHECK_AS(CheckpointWriteError, shape_numel(want.shape) == shape_numel(want.file_shape),
                      "checkpoint: tensor \"{}\" of shape {} cannot be saved as shape {}", name, shape_str(want.shape),
                      shape_str(want.file_shape));
      auto [it, fresh] = by_name.emplace(name, want);
      TensorPlan& p = it->second;
      TESSEL_CHECK_AS(CheckpointWriteError,
                      fresh || (p.group == want.group && p.dtype == want.dtype && p.shape == want.shape &&
                                p.file_shape == want.file_shape),
                      "checkpoint: rank {} holds \"{}\" as {} {} in '{}' but an earlier rank as {} {} in '{}'", r, name,
                      want.dtype, shape_str(want.shape), want.group, p.dtype, shape_str(p.shape), p.group);
      if (const Json* o = j.find("o")) {
        PieceRef piece{static_cast<int>(r), json_shape(*o), json_shape(j.at("e"))};
        bool held = false;
        for (const PieceRef& q : p.pieces) held = held || (q.offset == piece.offset && q.extent == piece.extent);
        if (!held) p.pieces.push_back(std::move(piece));
      }
    }
  }
  for (auto& [name, p] : by_name) {
    int64_t covered = 0;
    for (const PieceRef& q : p.pieces) covered += shape_numel(q.extent);
    TESSEL_CHECK_AS(CheckpointWriteError, covered == shape_numel(p.shape),
                    "checkpoint: the ranks' pieces of \"{}\" ({} {}) cover {} of its {} elements", name, p.placements,
                    shape_str(p.shape), covered, shape_numel(p.shape));
    plans.push_back(std::move(p));
  }
  // Per group: the tensors in name order, cut into up to `world` files of about equal bytes.
  std::map<std::string, std::vector<size_t>> groups;
  for (size_t i = 0; i < plans.size(); ++i) groups[plans[i].group].push_back(i);
  for (const auto& [group, members] : groups) {
    uint64_t total = 0;
    for (size_t i : members) total += plans[i].bytes();
    const uint64_t count = std::min<uint64_t>(static_cast<uint64_t>(world), members.size());
    std::vector<std::vector<size_t>> parts(count);
    uint64_t before = 0;
    for (size_t i : members) {
      const uint64_t f = total == 0 ? 0 : std::min<uint64_t>(count - 1, before * count / total);
      parts[f].push_back(i);
      before += plans[i].bytes();
    }
    std::erase_if(parts, [](const std::vector<size_t>& p) { return p.empty(); });
    for (size_t f = 0; f < parts.size(); ++f) {
      FilePlan file;
      file.group = group;
      file.name = parts.size() == 1 ? group + ".safetensors"
                                    : fmt::format("{}-{:05d}-of-{:05d}.safetensors", group, f + 1, parts.size());
      file.tensors = parts[f];
      std::vector<SafetensorsEntry> entries;
      uint64_t at = 0;
      for (size_t i : file.tensors) {
        plans[i].file = files.size();
        plans[i].begin = at;
        entries.push_back({plans[i].name, plans[i].dtype, plans[i].file_shape, at, at + plans[i].bytes()});
        at += plans[i].bytes();
      }
      std::map<std::string, std::string> meta{{"format", "pt"}};
      file.header = safetensors_header(file.name, entries, meta);
      file.size = file.header.size() + at;
      files.push_back(std::move(file));
    }
  }
}

}  // namespace

uint64_t checkpoint_checksum(const void* data, size_t n) {
  constexpr uint64_t P1 = 0x9E3779B185EBCA87ull, P2 = 0xC2B2AE3D27D4EB4Full, P3 = 0x165667B19E3779F9ull;
  auto rotl = [](uint64_t x, int r) { return (x << r) | (x >> (64 - r)); };
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t lane[4] = {P1 + P2, P2, 0, 0 - P1};
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int l = 0; l < 4; ++l) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      lane[l] = rotl(lane[l] + w * P2, 31) * P1;
    }
  uint64_t h = rotl(lane[0], 1) + rotl(lane[1], 7) + rotl(lane[2], 12) + rotl(lane[3], 18) + n;
  for (; i < n; ++i) h = rotl(h ^ (p[i] * P3), 11) * P1;
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P3;
  return h ^ (h >> 32);
}

struct PendingCheckpoint::Impl {
  std::string dir;
  int64_t step = 0;
  ProcessGroup* group = nullptr;
  CheckpointSaveOptions options;
  int rank = 0, world = 1;
  fs::path root, tmp, final_dir;
  std::vector<TensorPlan> plans;
  std::vector<FilePlan> files;
  struct Job {
    size_t plan;
    size_t piece;
  };
  std::vector<Job> jobs;
  std::vector<Tensor> sources;  // this rank's pieces, contiguous (copies when snapshotting)
  std::vector<uint64_t> sums;
  std::string write_error;
  Json trainer;
  bool written = false, published = false;
  // A background write and release_tensors(): which pieces the writer has claimed.
  static constexpr int kWaiting = 0, kWriting = 1, kWritten = 2;
  std::mutex claim_mu;
  std::condition_variable claim_cv;
  std::vector<int> job_state;
  std::atomic<bool> failed{false};
  bool released = false;
};

PendingCheckpoint::PendingCheckpoint(const std::string& dir, const CheckpointContent& content, ProcessGroup* group,
                                     const CheckpointSaveOptions& options, bool snapshot)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.dir = dir;
  m.step = content.step;
  m.group = group;
  m.options = options;
  m.rank = group ? group->rank() : 0;
  m.world = group ? group->size() : 1;
  m.trainer = content.trainer;
  const int rank = m.rank, world = m.world;
  m.root = fs::path(dir);
  m.tmp = m.root / fmt::format(".step-{:06d}.tmp", content.step);
  m.final_dir = m.root / fmt::format("step-{:06d}", content.step);
  const fs::path& root = m.root;
  const fs::path& tmp = m.tmp;
  if (auto f = armed_fault("save", group ? group->ranks()[static_cast<size_t>(rank)] : 0, content.step)) {
    std::lock_guard<std::mutex> lock(g_fault_mu);
    g_fault = f;
    g_fault_budget = f->after_bytes;
  }
  // Rank 0 clears what killed saves left and makes the folder; the gather that follows is the
  // point after which every rank may write into it.
  std::string setup_error;
  if (rank == 0) {
    try {
      std::error_code ec;
      fs::create_directories(root, ec);
      TESSEL_CHECK_AS(CheckpointWriteError, !ec, "checkpoint: cannot create '{}': {}", dir, ec.message());
      remove_stale_temporaries(root);
      fs::create_directories(tmp, ec);
      TESSEL_CHECK_AS(CheckpointWriteError, !ec, "checkpoint: cannot create '{}': {}", tmp.string(), ec.message());
    } catch (const std::exception& e) {
      setup_error = e.what();
    }
  }
  Json mine = Json::Object{};
  mine["error"] = setup_error;
  std::string describe_error;
  try {
    mine["tensors"] = describe_local(content);
  } catch (const std::exception& e) {
    describe_error = fmt::format("rank {}: {}", rank, e.what());
    mine["error"] = describe_error;
    mine["tensors"] = Json::Array{};
  }
  std::vector<std::string> gathered = gather_text(group, mine.dump());
  std::vector<std::string> described;
  for (size_t r = 0; r < gathered.size(); ++r) {
    const Json j = Json::parse(gathered[r]);
    const std::string err = j.at("error").as_string();
    if (!err.empty()) {
      if (rank == 0) {
        std::error_code ec;
        fs::remove_all(tmp, ec);
      }
      throw CheckpointWriteError(fmt::format("checkpoint at step {} not saved: {}", content.step, err));
    }
    described.push_back(j.at("tensors").dump());
  }
  make_plan(described, m.plans, m.files, world);
  const std::vector<TensorPlan>& plans = m.plans;

  // This rank's work: the headers of the files it owns, then its pieces.
  std::map<std::string, const Tensor*> held;  // name -> this rank's tensor
  for (const auto& [g, tensors] : content.groups)
    for (const CheckpointTensor& t : tensors) held[t.name] = &t.value;
  for (size_t i = 0; i < plans.size(); ++i)
    for (size_t q = 0; q < plans[i].pieces.size(); ++q)
      if (plans[i].pieces[q].rank == rank) m.jobs.push_back({i, q});
  // Pieces are found on this thread: the rank (and its allocator) is the calling thread's.
  // A snapshot copies them, so training may change the tensors while the files are written.
  m.sources.resize(m.jobs.size());
  for (size_t j = 0; j < m.jobs.size(); ++j) {
    const TensorPlan& p = plans[m.jobs[j].plan];
    Shape offset, extent;
    Tensor piece;
    TESSEL_CHECK_AS(CheckpointWriteError, box_of(*held.at(p.name), offset, extent, piece),
                    "tensor \"{}\": this rank holds no piece of it", p.name);
    m.sources[j] = snapshot ? view::clone(piece) : view::contiguous(piece);
  }
  m.sums.resize(m.jobs.size());
  m.job_state.assign(m.jobs.size(), Impl::kWaiting);
}

PendingCheckpoint::~PendingCheckpoint() = default;
PendingCheckpoint::PendingCheckpoint(PendingCheckpoint&&) noexcept = default;
PendingCheckpoint& PendingCheckpoint::operator=(PendingCheckpoint&&) noexcept = default;

int64_t PendingCheckpoint::step() const { return impl_->step; }

void PendingCheckpoint::write() {
  Impl& m = *impl_;
  if (m.written) return;
  m.written = true;
  const int rank = m.rank, world = m.world;
  const fs::path& tmp = m.tmp;
  const std::vector<TensorPlan>& plans = m.plans;
  const std::vector<FilePlan>& files = m.files;
  const auto& jobs = m.jobs;
  auto& sums = m.sums;
  const CheckpointSaveOptions& options = m.options;
  FdCache fds(O_WRONLY | O_CREAT);
  try {
    for (size_t f = 0; f < files.size(); ++f) {
      if (static_cast<int>(f % static_cast<size_t>(world)) != rank) continue;
      const std::string path = (tmp / files[f].name).string();
      const int fd = fds.get(path);
      TESSEL_CHECK_AS(CheckpointWriteError, ::ftruncate(fd, static_cast<off_t>(files[f].size)) == 0,
                      "checkpoint: cannot size '{}' to {} bytes: {}", path, files[f].size, sys_error());
      pwrite_all(fd, files[f].header.data(), files[f].header.size(), 0, path);
    }
    run_parallel(jobs.size(), options.threads, [&](size_t j) {
      // Claim the piece: from here release_tensors() waits for it instead of copying it.
      Tensor source;
      {
        std::lock_guard<std::mutex> lock(m.claim_mu);
        m.job_state[j] = Impl::kWriting;
        source = m.sources[j];
      }
      struct Done {
        Impl& m;
        size_t j;
        ~Done() {
          {
            std::lock_guard<std::mutex> lock(m.claim_mu);
            m.job_state[j] = Impl::kWritten;
          }
          m.claim_cv.notify_all();
        }
      } done{m, j};
      const TensorPlan& p = plans[jobs[j].plan];
      const PieceRef& piece_ref = p.pieces[jobs[j].piece];
      const char* src = static_cast<const char*>(source.raw_data());
      const FilePlan& file = files[p.file];
      const std::string path = (tmp / file.name).string();
      const int fd = fds.get(path);
      const uint64_t es = safetensors_dtype_size(p.dtype), base = file.header.size() + p.begin;
      for_each_run(p.shape, piece_ref.offset, piece_ref.extent, [&](int64_t at, int64_t from, int64_t count) {
        pwrite_all(fd, src + static_cast<uint64_t>(from) * es, static_cast<uint64_t>(count) * es,
                   base + static_cast<uint64_t>(at) * es, path);
      });
      sums[j] = checkpoint_checksum(src, source.nbytes());
    });
    fds.finish(/*sync=*/true);
  } catch (const std::exception& e) {
    m.write_error = fmt::format("rank {}: {}", rank, e.what());
    m.failed = true;
  }
}

void PendingCheckpoint::release_tensors() {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lock(m.claim_mu);
  if (m.released) return;
  // Pieces the writer has not reached yet become private copies (made on this thread, the
  // rank's); pieces it is writing now are waited for.
  for (size_t j = 0; j < m.sources.size(); ++j)
    if (m.job_state[j] == Impl::kWaiting && !m.failed) m.sources[j] = view::clone(m.sources[j]);
  m.claim_cv.wait(lock, [&] {
    return std::none_of(m.job_state.begin(), m.job_state.end(), [](int st) { return st == Impl::kWriting; });
  });
  m.released = true;
}

std::string PendingCheckpoint::publish() {
  Impl& m = *impl_;
  write();
  TESSEL_CHECK(!m.published, "checkpoint at step {} was already published", m.step);
  m.published = true;
  ProcessGroup* group = m.group;
  const int rank = m.rank, world = m.world;
  const fs::path &root = m.root, &tmp = m.tmp, &final_dir = m.final_dir;
  const std::string& dir = m.dir;
  const std::vector<TensorPlan>& plans = m.plans;
  const std::vector<FilePlan>& files = m.files;
  const auto& jobs = m.jobs;
  const auto& sums = m.sums;
  const std::string& write_error = m.write_error;
  const CheckpointSaveOptions& options = m.options;
  // Every rank learns whether every rank wrote; rank 0 records the pieces and publishes.
  Json result = Json::Object{};
  result["error"] = write_error;
  Json::Array done;
  for (size_t j = 0; j < jobs.size(); ++j)
    done.push_back(Json(Json::Array{Json(static_cast<int64_t>(jobs[j].plan)), Json(static_cast<int64_t>(jobs[j].piece)),
                                    Json(hex64(sums[j]))}));
  result["sums"] = Json(std::move(done));
  const std::vector<std::string> gathered = gather_text(group, result.dump());
  std::string failure;
  std::vector<std::vector<std::string>> checksums(plans.size());
  for (size_t i = 0; i < plans.size(); ++i) checksums[i].resize(plans[i].pieces.size());
  for (const std::string& text : gathered) {
    const Json j = Json::parse(text);
    if (failure.empty()) failure = j.at("error").as_string();
    for (const Json& s : j.at("sums").as_array()) {
      const Json::Array& a = s.as_array();
      checksums[static_cast<size_t>(a[0].as_int())][static_cast<size_t>(a[1].as_int())] = a[2].as_string();
    }
  }
  std::string publish_error;
  if (rank == 0 && failure.empty()) {
    try {
      Json index = Json::Object{};
      index["format"] = "tessel-checkpoint";
      index["version"] = 1;
      index["step"] = m.step;
      index["world_size"] = world;
      Json tensors = Json::Object{};
      std::map<std::string, Json> weight_maps;
      std::map<std::string, uint64_t> group_bytes;
      for (size_t i = 0; i < plans.size(); ++i) {
        const TensorPlan& p = plans[i];
        Json t = Json::Object{};
        t["group"] = p.group;
        t["file"] = files[p.file].name;
        t["dtype"] = p.dtype;
        t["shape"] = shape_json(p.file_shape);
        if (p.shape != p.file_shape) t["layout_shape"] = shape_json(p.shape);
        t["placements"] = p.placements;
        Json::Array pieces;
        for (size_t q = 0; q < p.pieces.size(); ++q) {
          Json pj = Json::Object{};
          pj["rank"] = p.pieces[q].rank;
          pj["offset"] = shape_json(p.pieces[q].offset);
          pj["extent"] = shape_json(p.pieces[q].extent);
          pj["checksum"] = checksums[i][q];
          pieces.push_back(std::move(pj));
        }
        t["pieces"] = Json(std::move(pieces));
        tensors[p.name] = std::move(t);
        if (!weight_maps.count(p.group)) weight_maps[p.group] = Json::Object{};
        weight_maps[p.group][p.name] = files[p.file].name;
        group_bytes[p.group] += p.bytes();
      }
      index["tensors"] = std::move(tensors);
      Json trainer = m.trainer.is_object() ? m.trainer : Json(Json::Object{});
      trainer["step"] = m.step;
      std::map<std::string, std::string> written;  // file -> contents, for the manifest
      written[kTrainerFile] = trainer.dump() + "\n";
      written[kIndexFile] = index.dump() + "\n";
      // Hugging Face's index of a checkpoint in several files.
      std::map<std::string, size_t> files_of_group;
      for (const FilePlan& f : files) ++files_of_group[f.group];
      for (const auto& [g, map] : weight_maps) {
        if (files_of_group[g] < 2) continue;
        Json hf = Json::Object{};
        Json meta = Json::Object{};
        meta["total_size"] = static_cast<int64_t>(group_bytes[g]);
        hf["metadata"] = meta;
        hf["weight_map"] = map;
        written[g + ".safetensors.index.json"] = hf.dump() + "\n";
      }
      for (const auto& [name, text] : written) write_durable(tmp / name, text);
      fsync_dir(tmp);
      // The manifest, last: every file with its size (and the JSON files' checksums).
      Json manifest = Json::Object{};
      manifest["step"] = m.step;
      Json listed = Json::Object{};
      for (const FilePlan& f : files) {
        Json e = Json::Object{};
        e["size"] = static_cast<int64_t>(f.size);
        listed[f.name] = e;
      }
      for (const auto& [name, text] : written) {
        Json e = Json::Object{};
        e["size"] = static_cast<int64_t>(text.size());
        e["checksum"] = hex64(checkpoint_checksum(text.data(), text.size()));
        listed[name] = e;
      }
      manifest["files"] = listed;
      write_durable(tmp / kManifestFile, manifest.dump() + "\n");
      fsync_dir(tmp);
      std::error_code ec;
      fs::remove_all(final_dir, ec);
      fs::rename(tmp, final_dir, ec);
      TESSEL_CHECK_AS(CheckpointWriteError, !ec, "checkpoint: cannot move '{}' to '{}': {}", tmp.string(),
                      final_dir.string(), ec.message());
      fsync_dir(root);
      if (options.keep_last > 0) {
        std::vector<std::pair<int64_t, fs::path>> steps;
        for (const auto& entry : fs::directory_iterator(root)) {
          const int64_t s = step_of_folder(entry.path().filename().string());
          if (s >= 0 && entry.is_directory()) steps.emplace_back(s, entry.path());
        }
        std::sort(steps.rbegin(), steps.rend());
        for (size_t i = static_cast<size_t>(options.keep_last); i < steps.size(); ++i) {
          if (steps[i].first == m.step) continue;
          fs::remove_all(steps[i].second, ec);
        }
      }
    } catch (const std::exception& e) {
      publish_error = e.what();
    }
  }
  if (!failure.empty() || !publish_error.empty()) {
    if (rank == 0) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
    }
  }
  const bool published = all_ok(group, failure.empty() && publish_error.empty());
  if (!published) {
    const std::string why = !failure.empty() ? failure : !publish_error.empty() ? publish_error : "rank 0 could not publish it";
    throw CheckpointWriteError(fmt::format("checkpoint at step {} not saved ({} kept its previous contents): {}",
                                      m.step, dir, why));
  }
  return final_dir.string();
}


std::string save_sharded_checkpoint(const std::string& dir, const CheckpointContent& content, ProcessGroup* group,
                                    const CheckpointSaveOptions& options) {
  PendingCheckpoint pending(dir, content, group, options, /*snapshot=*/false);
  pending.write();
  return pending.publish();
}

// ---- reading ----

struct CheckpointReader::Where {
  std::string file, dtype;
  Shape shape;
  uint64_t begin = 0;  // absolute offset of the tensor's data in the file
};

CheckpointReader::CheckpointReader(const std::string& step_dir) : dir_(step_dir) {
  const fs::path d(step_dir);
  TESSEL_CHECK_AS(CheckpointError, fs::is_directory(d), "checkpoint '{}' is not a folder", step_dir);
  const fs::path trainer = d / kTrainerFile;
  TESSEL_CHECK_AS(CheckpointError, fs::exists(trainer), "checkpoint '{}' has no {}", step_dir, kTrainerFile);
  // Only regular files are read: a pipe or device planted in a checkpoint would block or lie.
  for (const char* name : {kTrainerFile, kIndexFile, kManifestFile})
    TESSEL_CHECK_AS(CheckpointError, !fs::exists(d / name) || fs::is_regular_file(d / name),
                    "checkpoint '{}': {} is not a regular file", step_dir, name);
  try {
    trainer_ = Json::parse(read_text(trainer));
    TESSEL_CHECK(trainer_.is_object(), "not a JSON object");
  } catch (const CheckpointError&) {
    throw;
  } catch (const Error& e) {
    throw CheckpointError(fmt::format("checkpoint '{}': bad {}: {}", trainer.string(), kTrainerFile, e.what()));
  }
  if (fs::exists(d / kIndexFile)) {
    try {
      index_ = Json::parse(read_text(d / kIndexFile));
      TESSEL_CHECK(index_.is_object() && index_.find("tensors") != nullptr, "no \"tensors\"");
    } catch (const CheckpointError&) {
      throw;
    } catch (const Error& e) {
      throw CheckpointError(fmt::format("checkpoint '{}': bad {}: {}", (d / kIndexFile).string(), kIndexFile, e.what()));
    }
  }
  std::vector<fs::path> paths;
  for (const auto& entry : fs::directory_iterator(d))
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors") paths.push_back(entry.path());
  std::sort(paths.begin(), paths.end());
  for (const fs::path& p : paths) {
    const SafetensorsFile f = SafetensorsFile::open(p.string());
    for (const SafetensorsEntry& e : f.entries()) {
      TESSEL_CHECK_AS(CheckpointError, !where_.count(e.name), "checkpoint '{}': tensor \"{}\" is in both {} and {}",
                      step_dir, e.name, where_.at(e.name)->file, p.string());
      auto w = std::make_shared<Where>();
      w->file = p.string();
      w->dtype = e.dtype;
      w->shape = e.shape;
      w->begin = f.data_start() + e.begin;
      where_[e.name] = std::move(w);
    }
  }
}

int64_t CheckpointReader::step() const {
  const Json* s = trainer_.find("step");
  TESSEL_CHECK_AS(CheckpointError, s != nullptr && s->is_number(), "checkpoint '{}': {} has no step", dir_, kTrainerFile);
  const int64_t v = s->as_int();
  TESSEL_CHECK_AS(CheckpointError, v >= 0, "checkpoint '{}': step {} is negative", dir_, v);
  return v;
}

const Shape& CheckpointReader::shape(const std::string& name) const {
  auto it = where_.find(name);
  TESSEL_CHECK_AS(CheckpointError, it != where_.end(), "checkpoint '{}' has no tensor \"{}\"", dir_, name);
  return it->second->shape;
}

const std::string& CheckpointReader::dtype(const std::string& name) const {
  auto it = where_.find(name);
  TESSEL_CHECK_AS(CheckpointError, it != where_.end(), "checkpoint '{}' has no tensor \"{}\"", dir_, name);
  return it->second->dtype;
}

std::vector<std::string> CheckpointReader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, w] : where_) out.push_back(name);
  return out;
}

std::string CheckpointReader::group(const std::string& name) const {
  auto it = where_.find(name);
  TESSEL_CHECK_AS(CheckpointError, it != where_.end(), "checkpoint '{}' has no tensor \"{}\"", dir_, name);
  const std::string file = fs::path(it->second->file).filename().string();
  return file.substr(0, file.find_first_of("-."));
}

void CheckpointReader::read(const std::vector<CheckpointTensor>& targets, int threads) {
  // Check everything before reading anything, so a mismatch leaves the targets untouched.
  for (const CheckpointTensor& t : targets) {
    const Shape& have = shape(t.name);
    const Where& w = *where_.at(t.name);
    TESSEL_CHECK_AS(CheckpointError, shape_numel(have) == t.value.numel() && (t.file_shape.empty() || have == t.file_shape),
                    "checkpoint '{}': tensor \"{}\" has shape {} but {} is needed", w.file, t.name, shape_str(have),
                    shape_str(t.file_shape.empty() ? t.value.shape() : t.file_shape));
    TESSEL_CHECK_AS(CheckpointError, w.dtype != "F16" || t.value.dtype() == DType::f32,
                    "checkpoint '{}': tensor \"{}\" is F16, which loads only into f32", w.file, t.name);
    TESSEL_CHECK_AS(CheckpointError, w.dtype == "F16" || w.dtype == safetensors_dtype(t.value.dtype()) ||
                                         (is_floating(t.value.dtype()) && (w.dtype == "F32" || w.dtype == "F64" || w.dtype == "BF16")),
                    "checkpoint '{}': tensor \"{}\" is {}, which does not convert to {}", w.file, t.name, w.dtype,
                    t.value.dtype());
  }
  // Boxes and buffers are made on this thread: the rank (and its allocator) is the calling thread's.
  struct Job {
    const CheckpointTensor* target;
    const Where* where;
    Shape offset, extent;
    Tensor piece, buf;  // buf: where the bytes land (the piece itself when no conversion is needed)
    std::vector<uint16_t> halves;
  };
  std::vector<Job> jobs;
  for (const CheckpointTensor& t : targets) {
    Job job{&t, where_.at(t.name).get(), {}, {}, {}, {}, {}};
    if (!box_of(t.value, job.offset, job.extent, job.piece)) continue;
    const bool f16 = job.where->dtype == "F16";
    const bool direct = !f16 && safetensors_tessel_dtype(job.where->dtype) == job.piece.dtype() && job.piece.is_contiguous();
    job.buf = direct ? job.piece : Tensor::empty(job.extent, f16 ? DType::f32 : safetensors_tessel_dtype(job.where->dtype));
    if (f16) job.halves.resize(static_cast<size_t>(shape_numel(job.extent)));
    jobs.push_back(std::move(job));
  }
  FdCache fds(O_RDONLY);
  std::atomic<int64_t> bytes{0};
  run_parallel(jobs.size(), threads, [&](size_t i) {
    Job& job = jobs[i];
    const Where& w = *job.where;
    const uint64_t es = safetensors_dtype_size(w.dtype);
    char* dst = job.halves.empty() ? static_cast<char*>(job.buf.raw_data()) : reinterpret_cast<char*>(job.halves.data());
    const int fd = fds.get(w.file);
    // Pieces are in the value's coordinates; the file holds the same row-major elements.
    for_each_run(job.target->value.shape(), job.offset, job.extent, [&](int64_t at, int64_t from, int64_t count) {
      pread_all(fd, dst + static_cast<uint64_t>(from) * es, static_cast<uint64_t>(count) * es,
                w.begin + static_cast<uint64_t>(at) * es, w.file);
      bytes += count * static_cast<int64_t>(es);
    });
    if (!job.halves.empty()) widen_f16(job.halves.data(), job.buf.data<float>(), job.halves.size());
  });
  for (Job& job : jobs)
    if (job.buf.raw_data() != job.piece.raw_data())
      copy_(job.piece, job.buf.dtype() == job.piece.dtype() ? job.buf : cast(job.buf, job.piece.dtype()));
  fds.finish(/*sync=*/false);
  bytes_read_ += bytes.load();
}

std::string CheckpointReader::verify(int rank, int ranks) const {
  if (!index_.is_object()) return "";  // a checkpoint from before checksums: nothing to check
  try {
    return verify_pieces(rank, ranks);
  } catch (const CheckpointError&) {
    throw;
  } catch (const Error& e) {
    return fmt::format("bad {}: {}", kIndexFile, e.what());
  }
}

std::string CheckpointReader::verify_pieces(int rank, int ranks) const {
  struct Piece {
    const std::string* name;
    const Where* where;
    Shape shape, offset, extent;
    std::string checksum;
  };
  std::vector<Piece> mine;  // pieces i ≡ rank (mod ranks), in name order
  int64_t i = 0;
  for (const auto& [name, t] : index_.at("tensors").as_object()) {
    auto w = where_.find(name);
    if (w == where_.end()) return fmt::format("{} lists \"{}\", which no safetensors file holds", kIndexFile, name);
    const Shape shape = t.find("layout_shape") ? json_shape(t.at("layout_shape")) : json_shape(t.at("shape"));
    // The index is read, not trusted: every box must lie inside a tensor the files hold.
    int64_t numel = 1;
    for (int64_t d : shape) {
      if (d < 0 || (d > 0 && numel > (int64_t{1} << 50) / d)) return fmt::format("{}: \"{}\" has a bad shape", kIndexFile, name);
      numel *= d;
    }
    if (numel != shape_numel(w->second->shape))
      return fmt::format("{}: \"{}\" has {} elements in the index but {} in {}", kIndexFile, name, numel,
                         shape_numel(w->second->shape), w->second->file);
    for (const Json& p : t.at("pieces").as_array()) {
      if (i++ % ranks != rank) continue;
      Piece piece{&name, w->second.get(), shape, json_shape(p.at("offset")), json_shape(p.at("extent")),
                  p.at("checksum").as_string()};
      bool inside = piece.offset.size() == shape.size() && piece.extent.size() == shape.size();
      for (size_t d = 0; inside && d < shape.size(); ++d)
        inside = piece.offset[d] >= 0 && piece.extent[d] >= 0 && piece.offset[d] <= shape[d] &&
                 piece.extent[d] <= shape[d] - piece.offset[d];
      if (!inside) return fmt::format("{}: a piece of \"{}\" lies outside its shape {}", kIndexFile, name, shape_str(shape));
      mine.push_back(std::move(piece));
    }
  }
  FdCache fds(O_RDONLY);
  std::vector<std::string> bad(mine.size());
  run_parallel(mine.size(), 4, [&](size_t k) {
    const Piece& p = mine[k];
    const uint64_t es = safetensors_dtype_size(p.where->dtype);
    const size_t n = static_cast<size_t>(shape_numel(p.extent)) * es;
    // Reused per thread and not zero-filled: the bytes are read over at once.
    thread_local std::unique_ptr<char[]> buffer;
    thread_local size_t capacity = 0;
    if (capacity < n) {
      buffer.reset(new char[n]);
      capacity = n;
    }
    const int fd = fds.get(p.where->file);
    for_each_run(p.shape, p.offset, p.extent, [&](int64_t at, int64_t from, int64_t count) {
      pread_all(fd, buffer.get() + static_cast<uint64_t>(from) * es, static_cast<uint64_t>(count) * es,
                p.where->begin + static_cast<uint64_t>(at) * es, p.where->file);
    });
    const std::string sum = hex64(checkpoint_checksum(buffer.get(), n));
    if (sum != p.checksum)
      bad[k] = fmt::format("the piece of \"{}\" at {} in {} has checksum {}, but {} was written", *p.name,
                           shape_str(p.offset), p.where->file, sum, p.checksum);
  });
  for (const std::string& b : bad)
    if (!b.empty()) return b;
  return "";
}

std::string checkpoint_incomplete(const std::string& step_dir) {
  const fs::path d(step_dir);
  std::error_code ec;
  if (!fs::is_directory(d, ec)) return "not a folder";
  const fs::path manifest = d / kManifestFile;
  if (!fs::exists(manifest, ec)) {
    if (!fs::exists(d / kTrainerFile, ec)) return fmt::format("no {} (the save did not finish)", kManifestFile);
    try {  // a checkpoint from before manifests: every file must at least parse
      CheckpointReader reader(step_dir);
      reader.step();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }
  try {
    const Json m = Json::parse(read_text(manifest));
    for (const auto& [name, e] : m.at("files").as_object()) {
      TESSEL_CHECK(name.find('/') == std::string::npos && name != ".." && name != ".",
                   "it lists '{}', which is not a file of the folder", name);
      const fs::path f = d / name;
      std::error_code fe;
      const auto size = fs::file_size(f, fe);
      if (fe) return fmt::format("{} lists {}, which is missing", kManifestFile, name);
      if (static_cast<int64_t>(size) != e.at("size").as_int())
        return fmt::format("{} has {} bytes but {} were written", name, size, e.at("size").as_int());
      if (const Json* sum = e.find("checksum")) {
        const std::string text = read_text(f);
        if (hex64(checkpoint_checksum(text.data(), text.size())) != sum->as_string())
          return fmt::format("{} does not match its checksum", name);
      }
    }
  } catch (const std::exception& e) {
    return fmt::format("bad {}: {}", kManifestFile, e.what());
  }
  return "";
}

bool has_complete_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (step_of_folder(entry.path().filename().string()) >= 0 && checkpoint_incomplete(entry.path().string()).empty())
      return true;
  return false;
}

std::string choose_checkpoint(const std::string& path, ProcessGroup* group, bool verify) {
  const fs::path p(path);
  const int rank = group ? group->rank() : 0, ranks = group ? group->size() : 1;
  std::error_code ec;
  TESSEL_CHECK_AS(CheckpointError, fs::exists(p, ec), "checkpoint path '{}' does not exist", path);
  auto checked = [&](const std::string& dir) -> std::string {
    std::string why = checkpoint_incomplete(dir);
    if (why.empty() && verify) {
      try {
        why = CheckpointReader(dir).verify(rank, ranks);
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    // Every rank must choose the same folder: one rank's doubt rules it out for all.
    const bool ok = all_ok(group, why.empty());
    if (!ok && why.empty()) why = "another rank found it damaged";
    return ok ? "" : why;
  };
  const bool is_step = fs::exists(p / kManifestFile, ec) || fs::exists(p / kTrainerFile, ec) ||
                       step_of_folder(p.filename().string()) >= 0;
  if (is_step) {
    const std::string why = checked(p.string());
    TESSEL_CHECK_AS(CheckpointError, why.empty(), "checkpoint '{}' cannot be resumed from: {}", path, why);
    return p.string();
  }
  if (rank == 0) remove_stale_temporaries(p);
  std::vector<std::pair<int64_t, fs::path>> steps;  // by number: step-1000000 is newer than step-999999
  for (const auto& entry : fs::directory_iterator(p)) {
    const int64_t s = step_of_folder(entry.path().filename().string());
    if (s >= 0 && entry.is_directory()) steps.emplace_back(s, entry.path());
  }
  std::sort(steps.rbegin(), steps.rend());
  for (const auto& [s, dir] : steps) {
    const std::string why = checked(dir.string());
    if (why.empty()) return dir.string();
    if (rank == 0) log_warn("skipping checkpoint {}: {}; trying an older one", dir.string(), why);
  }
  throw CheckpointError(fmt::format("no complete checkpoint (step-NNNNNN folder) under '{}'", path));
}

}  // namespace tessel
