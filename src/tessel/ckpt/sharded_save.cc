// Distributed checkpoints, the save: every rank plans the same files and writes its own pieces
// into them; rank 0 publishes the step folder once every rank has written (sharded.h).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "tessel/ckpt/peer_copies.h"
#include "tessel/ckpt/piece_io.h"
#include "tessel/ckpt/safetensors.h"
#include "tessel/ckpt/sharded.h"
#include "tessel/core/view.h"
#include "tessel/dist/dtensor.h"

namespace tessel {

using namespace ckpt_io;

namespace {

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
  // With machines (options.machines): this rank's machine, its ranks, and whether this rank is its
  // lowest (which does there what rank 0 does in a shared folder).
  std::vector<int> local;
  bool lead = true;
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
  // A background write and release_tensors(): whether each piece still reads the live tensor
  // (waiting), is being copied off it by the writer (copying), or no longer needs it (private: a
  // staged copy, or a clone release_tensors made).
  static constexpr int kWaiting = 0, kCopying = 1, kPrivate = 2;
  std::vector<std::vector<char>> staged;  // the writer's copies (plain memory, off the rank's allocator)
  std::mutex claim_mu;
  std::condition_variable claim_cv;
  std::vector<int> job_state;
  std::atomic<bool> failed{false};
  bool released = false;

  void exchange_peer_copies();
  Json held_here() const;
};

// Peer copies: this rank's pieces go to its peer rank on the next machine, which writes them
// into its own machine's folder; the pieces of the ranks whose peer this rank is come in the
// same way. Every rank takes part (even after its own write failed), so none waits in vain; a
// failure is reported by publish() on every rank.
void PendingCheckpoint::Impl::exchange_peer_copies() {
  const std::vector<int>& machines = options.machines;
  constexpr int kPeerTag = 0x7C000000;  // apart from the pipeline's tags
  try {
    TESSEL_CHECK_AS(CheckpointWriteError, !released,
                    "checkpoint: peer copies are sent from the live tensors, so they need a synchronous save");
    std::vector<WorkPtr> works;
    struct Incoming {
      size_t plan, piece;
      int src, tag;
      std::vector<char> bytes;
    };
    std::vector<Incoming> incoming;
    for (int src = 0; src < world; ++src) {
      if (src == rank || peer_copy_rank(machines, src) != rank) continue;
      int tag = kPeerTag;  // src's j-th piece has tag kPeerTag + j, as src numbers its jobs
      for (size_t i = 0; i < plans.size(); ++i)
        for (size_t q = 0; q < plans[i].pieces.size(); ++q) {
          if (plans[i].pieces[q].rank != src) continue;
          const uint64_t n = static_cast<uint64_t>(shape_numel(plans[i].pieces[q].extent)) *
                             safetensors_dtype_size(plans[i].dtype);
          if (n > 0) incoming.push_back({i, q, src, tag, std::vector<char>(n)});
          ++tag;
        }
    }
    for (Incoming& in : incoming)
      works.push_back(
          group->recv_async(in.bytes.data(), static_cast<int64_t>(in.bytes.size()), DType::b8, in.src, in.tag));
    const int peer = peer_copy_rank(machines, rank);
    for (size_t j = 0; j < jobs.size(); ++j)
      if (sources[j].nbytes() > 0)
        works.push_back(group->send_async(sources[j].raw_data(), static_cast<int64_t>(sources[j].nbytes()), DType::b8,
                                          peer, kPeerTag + static_cast<int>(j)));
    for (WorkPtr& w : works) w->wait();
    FdCache fds(O_WRONLY | O_CREAT);
    for (const Incoming& in : incoming) {
      const TensorPlan& p = plans[in.plan];
      const PieceRef& piece_ref = p.pieces[in.piece];
      const FilePlan& file = files[p.file];
      const std::string path = (tmp / file.name).string();
      const int fd = fds.get(path);
      const uint64_t es = safetensors_dtype_size(p.dtype), base = file.header.size() + p.begin;
      for_each_run(p.shape, piece_ref.offset, piece_ref.extent, [&](int64_t at, int64_t from, int64_t count) {
        pwrite_all(fd, in.bytes.data() + static_cast<uint64_t>(from) * es, static_cast<uint64_t>(count) * es,
                   base + static_cast<uint64_t>(at) * es, path);
      });
    }
    fds.finish(/*sync=*/true);
  } catch (const std::exception& e) {
    if (write_error.empty()) write_error = fmt::format("rank {} (peer copies): {}", rank, e.what());
    failed = true;
  }
}

// manifest.json's "memory_copies" of this machine's folder: the saving ranks whose pieces it
// holds, as its own ranks' and as peer copies.
Json PendingCheckpoint::Impl::held_here() const {
  Json::Array own, peer;
  for (int r = 0; r < world; ++r) {
    if (std::find(local.begin(), local.end(), r) != local.end()) own.emplace_back(static_cast<int64_t>(r));
    else if (std::find(local.begin(), local.end(), peer_copy_rank(options.machines, r)) != local.end())
      peer.emplace_back(static_cast<int64_t>(r));
  }
  Json out = Json::Object{};
  out["own"] = Json(std::move(own));
  out["peer"] = Json(std::move(peer));
  return out;
}

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
  if (!options.machines.empty()) {
    TESSEL_CHECK(static_cast<int>(options.machines.size()) == world, "checkpoint: {} machine names for {} ranks",
                 options.machines.size(), world);
    for (int r = 0; r < world; ++r)
      if (options.machines[static_cast<size_t>(r)] == options.machines[static_cast<size_t>(rank)]) m.local.push_back(r);
    m.lead = m.local.front() == rank;
  } else {
    m.lead = rank == 0;
  }
  m.root = fs::path(dir);
  m.tmp = m.root / fmt::format(".step-{:06d}.tmp", content.step);
  m.final_dir = m.root / fmt::format("step-{:06d}", content.step);
  const fs::path& root = m.root;
  const fs::path& tmp = m.tmp;
  if (auto f = armed_fault("save", group ? group->ranks()[static_cast<size_t>(rank)] : 0, content.step))
    arm_save_fault(*f);
  // Rank 0 (each machine's lowest rank, with machines) clears what killed saves left and makes the
  // folder; the gather that follows is the point after which every rank may write into it.
  std::string setup_error;
  if (m.lead) {
    try {
      std::error_code ec;
      fs::create_directories(root, ec);
      TESSEL_CHECK_AS(CheckpointWriteError, !ec, "checkpoint: cannot create '{}': {}", dir, ec.message());
      remove_stale_temporaries(root);
      fs::create_directories(tmp, ec);
      TESSEL_CHECK_AS(CheckpointWriteError, !ec, "checkpoint: cannot create '{}': {}", tmp.string(), ec.message());
      write_save_owner(tmp);
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
      if (m.lead) {
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
    // Files are written from host memory: a piece on a device is staged into a host copy here
    // (a private copy, so it serves a snapshot too).
    if (!host_accessible(piece.device())) m.sources[j] = piece.to(Device{});
    else m.sources[j] = snapshot ? view::clone(piece) : view::contiguous(piece);
  }
  m.sums.resize(m.jobs.size());
  m.job_state.assign(m.jobs.size(), Impl::kWaiting);
}

PendingCheckpoint::~PendingCheckpoint() = default;
PendingCheckpoint::PendingCheckpoint(PendingCheckpoint&&) noexcept = default;
PendingCheckpoint& PendingCheckpoint::operator=(PendingCheckpoint&&) noexcept = default;

int64_t PendingCheckpoint::step() const { return impl_->step; }

void PendingCheckpoint::write(bool stage_first) {
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
      // A file's header is written by one rank of each folder: of the world, or of the machine.
      if (m.local.empty() ? static_cast<int>(f % static_cast<size_t>(world)) != rank
                          : m.local[f % m.local.size()] != rank)
        continue;
      const std::string path = (tmp / files[f].name).string();
      const int fd = fds.get(path);
      TESSEL_CHECK_AS(CheckpointWriteError, ::ftruncate(fd, static_cast<off_t>(files[f].size)) == 0,
                      "checkpoint: cannot size '{}' to {} bytes: {}", path, files[f].size, sys_error());
      pwrite_all(fd, files[f].header.data(), files[f].header.size(), 0, path);
    }
    // In the background, first stage every piece still read from the live tensors into the
    // writer's own memory — a memcpy per piece, done long before the next update — so
    // release_tensors() rarely has anything left to copy or wait for; then write from the copies.
    m.staged.resize(jobs.size());
    if (stage_first) run_parallel(jobs.size(), options.threads, [&](size_t j) {
      Tensor source;
      {
        std::lock_guard<std::mutex> lock(m.claim_mu);
        if (m.job_state[j] != Impl::kWaiting) return;  // already private (cloned by release_tensors)
        m.job_state[j] = Impl::kCopying;
        source = m.sources[j];
      }
      struct Done {
        Impl& m;
        size_t j;
        ~Done() {
          {
            std::lock_guard<std::mutex> lock(m.claim_mu);
            m.job_state[j] = Impl::kPrivate;
          }
          m.claim_cv.notify_all();
        }
      } done{m, j};
      const char* src = static_cast<const char*>(source.raw_data());
      m.staged[j].assign(src, src + source.nbytes());
    });
    run_parallel(jobs.size(), options.threads, [&](size_t j) {
      const char* src;
      uint64_t bytes;
      {
        std::lock_guard<std::mutex> lock(m.claim_mu);
        if (m.job_state[j] == Impl::kPrivate && !m.staged[j].empty()) {
          src = m.staged[j].data();
          bytes = m.staged[j].size();
        } else {
          // Not staged: the live tensor (a synchronous save, which holds training anyway), or a
          // clone release_tensors made. Claimed, so release_tensors waits for it.
          if (m.job_state[j] == Impl::kWaiting) m.job_state[j] = Impl::kCopying;
          src = static_cast<const char*>(m.sources[j].raw_data());
          bytes = static_cast<uint64_t>(m.sources[j].nbytes());
        }
      }
      struct Written {  // also when the write throws: release_tensors() must never wait in vain
        Impl& m;
        size_t j;
        ~Written() {
          {
            std::lock_guard<std::mutex> lock(m.claim_mu);
            if (m.job_state[j] == Impl::kCopying) m.job_state[j] = Impl::kPrivate;
            std::vector<char>().swap(m.staged[j]);  // its copy is freed
          }
          m.claim_cv.notify_all();
        }
      } written{m, j};
      const TensorPlan& p = plans[jobs[j].plan];
      const PieceRef& piece_ref = p.pieces[jobs[j].piece];
      const FilePlan& file = files[p.file];
      const std::string path = (tmp / file.name).string();
      const int fd = fds.get(path);
      const uint64_t es = safetensors_dtype_size(p.dtype), base = file.header.size() + p.begin;
      for_each_run(p.shape, piece_ref.offset, piece_ref.extent, [&](int64_t at, int64_t from, int64_t count) {
        pwrite_all(fd, src + static_cast<uint64_t>(from) * es, static_cast<uint64_t>(count) * es,
                   base + static_cast<uint64_t>(at) * es, path);
      });
      sums[j] = checkpoint_checksum(src, bytes);
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
  // Pieces the writer has not staged yet become private copies (made on this thread, the
  // rank's); pieces it is copying now are waited for.
  for (size_t j = 0; j < m.sources.size(); ++j)
    if (m.job_state[j] == Impl::kWaiting && !m.failed) {
      m.sources[j] = view::clone(m.sources[j]);
      m.job_state[j] = Impl::kPrivate;
    }
  m.claim_cv.wait(lock, [&] {
    return std::none_of(m.job_state.begin(), m.job_state.end(), [](int st) { return st == Impl::kCopying; });
  });
  m.released = true;
}

std::string PendingCheckpoint::publish() {
  Impl& m = *impl_;
  write();
  TESSEL_CHECK(!m.published, "checkpoint at step {} was already published", m.step);
  m.published = true;
  ProcessGroup* group = m.group;
  const int world = m.world;
  const fs::path &root = m.root, &tmp = m.tmp, &final_dir = m.final_dir;
  const std::string& dir = m.dir;
  const std::vector<TensorPlan>& plans = m.plans;
  const std::vector<FilePlan>& files = m.files;
  const auto& jobs = m.jobs;
  const auto& sums = m.sums;
  if (!m.options.machines.empty()) m.exchange_peer_copies();
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
  if (m.lead && failure.empty()) {
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
      // The manifest, last: every file with its size, the safetensors files' header checksums
      // (the tensors' data is checksummed piece by piece in checkpoint.json) and the JSON
      // files' checksums.
      Json manifest = Json::Object{};
      manifest["step"] = m.step;
      Json listed = Json::Object{};
      for (const FilePlan& f : files) {
        Json e = Json::Object{};
        e["size"] = static_cast<int64_t>(f.size);
        e["header_bytes"] = static_cast<int64_t>(f.header.size());
        e["header_checksum"] = hex64(checkpoint_checksum(f.header.data(), f.header.size()));
        listed[f.name] = e;
      }
      for (const auto& [name, text] : written) {
        Json e = Json::Object{};
        e["size"] = static_cast<int64_t>(text.size());
        e["checksum"] = hex64(checkpoint_checksum(text.data(), text.size()));
        listed[name] = e;
      }
      manifest["files"] = listed;
      if (!m.options.machines.empty()) manifest["memory_copies"] = m.held_here();
      write_durable(tmp / kManifestFile, manifest.dump() + "\n");
      fsync_dir(tmp);
      std::error_code ec;
      fs::remove(tmp / kSaveOwnerFile, ec);
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
    if (m.lead) {
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

}  // namespace tessel
