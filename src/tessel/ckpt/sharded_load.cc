// Distributed checkpoints, the load: each rank reads the byte runs of its own pieces in its
// own layout; a step folder is chosen only when complete and its pieces match their checksums.
#include "tessel/ckpt/sharded.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>

#include "tessel/ckpt/peer_copies.h"
#include "tessel/ckpt/piece_io.h"
#include "tessel/ckpt/safetensors.h"
#include "tessel/core/log.h"
#include "tessel/dist/dtensor.h"
#include "tessel/ops/elementwise.h"
#include "tessel/ops/inplace.h"

namespace tessel {

using namespace ckpt_io;

// ---- reading ----

struct CheckpointReader::Where {
  std::string file, dtype;
  Shape shape;
  uint64_t begin = 0;  // absolute offset of the tensor's data in the file
};

struct CheckpointReader::SavedPiece {
  const std::string* name;
  const Where* where;
  Shape shape, offset, extent;  // in the tensor's layout shape
  std::string checksum;
  size_t id;                    // its place in checkpoint.json (name order), the same on every rank
};

// What a verified read found: per saved piece, whether this rank checked it from its read
// (1) and whether it read some of it (1); and the first mismatch.
struct CheckpointReader::Verification {
  std::vector<SavedPiece> pieces;
  std::map<std::string, std::vector<const SavedPiece*>> by_name;
  std::vector<int64_t> checked, touched;
  std::mutex mu;
  std::string bad;
  void fail(std::string why) {
    std::lock_guard<std::mutex> lock(mu);
    if (bad.empty()) bad = std::move(why);
  }
};

namespace {

bool inside(const Shape& offset, const Shape& extent, const Shape& box_offset, const Shape& box_extent) {
  for (size_t d = 0; d < offset.size(); ++d)
    if (offset[d] < box_offset[d] || offset[d] + extent[d] > box_offset[d] + box_extent[d]) return false;
  return true;
}

bool overlaps(const Shape& offset, const Shape& extent, const Shape& box_offset, const Shape& box_extent) {
  for (size_t d = 0; d < offset.size(); ++d)
    if (offset[d] >= box_offset[d] + box_extent[d] || box_offset[d] >= offset[d] + extent[d] || extent[d] == 0)
      return false;
  return true;
}

std::string mismatch(const std::string& name, const Shape& offset, const std::string& file, const std::string& sum,
                     const std::string& want) {
  return fmt::format("the piece of \"{}\" at {} in {} has checksum {}, but {} was written", name, shape_str(offset),
                     file, sum, want);
}

}  // namespace

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
  read_into(targets, threads, nullptr);
}

std::string CheckpointReader::read_verified(const std::vector<CheckpointTensor>& targets, ProcessGroup* group,
                                            int threads) {
  if (!index_.is_object()) {  // a checkpoint from before checksums: nothing to check
    read_into(targets, threads, nullptr);
    return "";
  }
  const int rank = group ? group->rank() : 0, ranks = group ? group->size() : 1;
  Verification v;
  std::string why;
  try {
    v.pieces = saved_pieces();
  } catch (const CheckpointError&) {
    throw;
  } catch (const Error& e) {
    why = fmt::format("bad {}: {}", kIndexFile, e.what());
  }
  for (const SavedPiece& p : v.pieces) v.by_name[*p.name].push_back(&p);
  v.checked.assign(v.pieces.size(), 0);
  v.touched.assign(v.pieces.size(), 0);
  if (why.empty()) {
    read_into(targets, threads, &v);
    why = v.bad;
  }
  // Pieces some rank read only in part: one rank reads each whole.
  if (group != nullptr && ranks > 1 && !v.pieces.empty()) {
    group->all_reduce(v.checked.data(), static_cast<int64_t>(v.checked.size()), DType::i64, ReduceOp::max);
    group->all_reduce(v.touched.data(), static_cast<int64_t>(v.touched.size()), DType::i64, ReduceOp::max);
  }
  // Largest first, each to the rank with the fewest bytes so far (the same choice on every rank).
  std::vector<const SavedPiece*> partial;
  for (const SavedPiece& p : v.pieces)
    if (v.touched[p.id] != 0 && v.checked[p.id] == 0) partial.push_back(&p);
  auto bytes_of = [](const SavedPiece* p) {
    return shape_numel(p->extent) * static_cast<int64_t>(safetensors_dtype_size(p->where->dtype));
  };
  std::stable_sort(partial.begin(), partial.end(),
                   [&](const SavedPiece* a, const SavedPiece* b) { return bytes_of(a) > bytes_of(b); });
  std::vector<int64_t> load(static_cast<size_t>(ranks), 0);
  std::vector<const SavedPiece*> rest;
  for (const SavedPiece* p : partial) {
    const size_t r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[r] += bytes_of(p);
    if (static_cast<int>(r) == rank) rest.push_back(p);
  }
  if (why.empty()) why = check_pieces(rest);
  // Every rank must reach the same verdict.
  const bool ok = all_ok(group, why.empty());
  if (!ok && why.empty()) why = "another rank found a piece damaged";
  return ok ? "" : why;
}

void CheckpointReader::read_into(const std::vector<CheckpointTensor>& targets, int threads, Verification* verify) {
  // Check everything before reading anything, so a mismatch leaves the targets untouched.
  for (const CheckpointTensor& t : targets) {
    const Shape& have = shape(t.name);
    const Where& w = *where_.at(t.name);
    TESSEL_CHECK_AS(CheckpointError, have == (t.file_shape.empty() ? t.value.shape() : t.file_shape),
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
    Tensor piece;
    // Where the bytes land: the piece itself when it is host memory of the file's dtype, else
    // host staging (`host`, in the file's dtype; f16 is widened into `widened`), copied into the
    // piece on its device afterwards.
    bool direct = false;
    std::vector<char> host;
    std::vector<float> widened;
  };
  std::vector<Job> jobs;
  for (const CheckpointTensor& t : targets) {
    Job job{&t, where_.at(t.name).get(), {}, {}, {}, false, {}, {}};
    if (!box_of(t.value, job.offset, job.extent, job.piece)) continue;
    const bool f16 = job.where->dtype == "F16";
    job.direct = !f16 && safetensors_tessel_dtype(job.where->dtype) == job.piece.dtype() && job.piece.is_contiguous() &&
                 host_accessible(job.piece.device());
    if (!job.direct)
      job.host.resize(static_cast<size_t>(shape_numel(job.extent)) * safetensors_dtype_size(job.where->dtype));
    if (f16) job.widened.resize(static_cast<size_t>(shape_numel(job.extent)));
    jobs.push_back(std::move(job));
  }
  // Checks the saved pieces of a job's tensor against the bytes just read (in the file's dtype):
  // those inside the job's box from the buffer; the others it overlaps are marked touched.
  auto check_read = [](const Job& job, const char* dst, uint64_t es, Verification& v) {
    auto it = v.by_name.find(job.target->name);
    if (it == v.by_name.end()) return;
    const Shape& shape = job.target->value.shape();
    thread_local std::vector<char> gather;
    for (const SavedPiece* p : it->second) {
      if (p->shape != shape) {  // saved in another shape: which bytes it holds is not known here
        v.touched[p->id] = 1;
        continue;
      }
      if (!overlaps(p->offset, p->extent, job.offset, job.extent)) continue;
      v.touched[p->id] = 1;
      if (!inside(p->offset, p->extent, job.offset, job.extent)) continue;
      const size_t n = static_cast<size_t>(shape_numel(p->extent)) * es;
      const char* bytes = dst;
      if (p->offset != job.offset || p->extent != job.extent) {
        gather.resize(n);
        Shape rel(p->offset.size());
        for (size_t d = 0; d < rel.size(); ++d) rel[d] = p->offset[d] - job.offset[d];
        for_each_run(job.extent, rel, p->extent, [&](int64_t at, int64_t from, int64_t count) {
          std::memcpy(gather.data() + static_cast<uint64_t>(from) * es, dst + static_cast<uint64_t>(at) * es,
                      static_cast<uint64_t>(count) * es);
        });
        bytes = gather.data();
      }
      const std::string sum = hex64(checkpoint_checksum(bytes, n));
      if (sum != p->checksum) v.fail(mismatch(*p->name, p->offset, p->where->file, sum, p->checksum));
      v.checked[p->id] = 1;
    }
  };
  FdCache fds(O_RDONLY);
  std::atomic<int64_t> bytes{0};
  run_parallel(jobs.size(), threads, [&](size_t i) {
    Job& job = jobs[i];
    const Where& w = *job.where;
    const uint64_t es = safetensors_dtype_size(w.dtype);
    char* dst = job.direct ? static_cast<char*>(job.piece.raw_data()) : job.host.data();
    const int fd = fds.get(w.file);
    // Pieces are in the value's coordinates; the file holds the same row-major elements.
    for_each_run(job.target->value.shape(), job.offset, job.extent, [&](int64_t at, int64_t from, int64_t count) {
      pread_all(fd, dst + static_cast<uint64_t>(from) * es, static_cast<uint64_t>(count) * es,
                w.begin + static_cast<uint64_t>(at) * es, w.file);
      bytes += count * static_cast<int64_t>(es);
    });
    if (verify != nullptr) check_read(job, dst, es, *verify);
    if (!job.widened.empty())
      widen_f16(reinterpret_cast<const uint16_t*>(job.host.data()), job.widened.data(), job.widened.size());
  });
  for (Job& job : jobs) {
    if (job.direct) continue;
    const Tensor staged = job.widened.empty()
                              ? Tensor::borrow_host(job.host.data(), job.extent, safetensors_tessel_dtype(job.where->dtype))
                              : Tensor::borrow_host(job.widened.data(), job.extent, DType::f32);
    copy_(job.piece, staged);  // converts and moves to the piece's device
  }
  fds.finish(/*sync=*/false);
  bytes_read_ += bytes.load();
}

std::string CheckpointReader::verify(int rank, int ranks) {
  if (!index_.is_object()) return "";  // a checkpoint from before checksums: nothing to check
  std::vector<SavedPiece> pieces;
  try {
    pieces = saved_pieces();
  } catch (const CheckpointError&) {
    throw;
  } catch (const Error& e) {
    return fmt::format("bad {}: {}", kIndexFile, e.what());
  }
  std::vector<const SavedPiece*> mine;  // pieces i ≡ rank (mod ranks)
  for (const SavedPiece& p : pieces)
    if (static_cast<int64_t>(p.id) % ranks == rank) mine.push_back(&p);
  return check_pieces(mine);
}

std::vector<CheckpointReader::SavedPiece> CheckpointReader::saved_pieces() const {
  std::vector<SavedPiece> out;
  for (const auto& [name, t] : index_.at("tensors").as_object()) {
    auto w = where_.find(name);
    TESSEL_CHECK(w != where_.end(), "it lists \"{}\", which no safetensors file holds", name);
    const Shape shape = t.find("layout_shape") ? json_shape(t.at("layout_shape")) : json_shape(t.at("shape"));
    // The index is read, not trusted: every box must lie inside a tensor the files hold.
    int64_t numel = 1;
    for (int64_t d : shape) {
      TESSEL_CHECK(d >= 0 && (d == 0 || numel <= (int64_t{1} << 50) / d), "\"{}\" has a bad shape", name);
      numel *= d;
    }
    TESSEL_CHECK(numel == shape_numel(w->second->shape), "\"{}\" has {} elements in the index but {} in {}", name,
                 numel, shape_numel(w->second->shape), w->second->file);
    // And the file's header agrees with the index on the stored shape and dtype, not only on
    // the element count (a [16, 256] stored for [256, 16] has the count right).
    TESSEL_CHECK(json_shape(t.at("shape")) == w->second->shape, "\"{}\" has shape {} in {} but {} in the index",
                 name, shape_str(w->second->shape), w->second->file, shape_str(json_shape(t.at("shape"))));
    if (const Json* dt = t.find("dtype"))
      TESSEL_CHECK(dt->as_string() == w->second->dtype, "\"{}\" is {} in {} but {} in the index", name,
                   w->second->dtype, w->second->file, dt->as_string());
    for (const Json& p : t.at("pieces").as_array()) {
      SavedPiece piece{&name, w->second.get(), shape, json_shape(p.at("offset")), json_shape(p.at("extent")),
                       p.at("checksum").as_string(), out.size()};
      bool in = piece.offset.size() == shape.size() && piece.extent.size() == shape.size();
      for (size_t d = 0; in && d < shape.size(); ++d)
        in = piece.offset[d] >= 0 && piece.extent[d] >= 0 && piece.offset[d] <= shape[d] &&
             piece.extent[d] <= shape[d] - piece.offset[d];
      TESSEL_CHECK(in, "a piece of \"{}\" lies outside its shape {}", name, shape_str(shape));
      out.push_back(std::move(piece));
    }
  }
  return out;
}

std::string CheckpointReader::check_pieces(const std::vector<const SavedPiece*>& pieces) {
  FdCache fds(O_RDONLY);
  std::atomic<int64_t> bytes{0};
  std::vector<std::string> bad(pieces.size());
  run_parallel(pieces.size(), 4, [&](size_t k) {
    const SavedPiece& p = *pieces[k];
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
      bytes += count * static_cast<int64_t>(es);
    });
    const std::string sum = hex64(checkpoint_checksum(buffer.get(), n));
    if (sum != p.checksum) bad[k] = mismatch(*p.name, p.offset, p.where->file, sum, p.checksum);
  });
  bytes_read_ += bytes.load();
  for (const std::string& b : bad)
    if (!b.empty()) return b;
  return "";
}

std::string checkpoint_incomplete(const std::string& step_dir) {
  std::string why = checkpoint_files_incomplete(step_dir);
  if (!why.empty()) return why;
  // A machine's in-memory copy may hold only its own ranks' pieces and its peer copies.
  try {
    const fs::path manifest = fs::path(step_dir) / kManifestFile;
    std::error_code ec;
    if (fs::exists(manifest, ec)) return memory_copy_missing(Json::parse(read_text(manifest)), step_dir);
  } catch (const std::exception& e) {
    return fmt::format("bad {}: {}", kManifestFile, e.what());
  }
  return "";
}

namespace ckpt_io {

std::string checkpoint_files_incomplete(const std::string& step_dir) {
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
      // A safetensors file's header (its length and JSON: each tensor's dtype, shape and
      // offsets), read and checked before anything trusts it.
      if (const Json* sum = e.find("header_checksum")) {
        const int64_t n = e.at("header_bytes").as_int();
        if (n < 8 || n > static_cast<int64_t>(size))
          return fmt::format("{} lists a header of {} bytes for {}, a file of {}", kManifestFile, n, name, size);
        std::string head(static_cast<size_t>(n), '\0');
        std::ifstream in(f, std::ios::binary);
        if (!in.read(head.data(), n)) return fmt::format("{}: cannot read its header", name);
        if (hex64(checkpoint_checksum(head.data(), head.size())) != sum->as_string())
          return fmt::format("{}'s header does not match its checksum", name);
      }
    }
  } catch (const std::exception& e) {
    return fmt::format("bad {}: {}", kManifestFile, e.what());
  }
  return "";
}

}  // namespace ckpt_io

int64_t checkpoint_step_of(const std::string& folder_name) { return step_of_folder(folder_name); }

bool has_complete_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (step_of_folder(entry.path().filename().string()) >= 0 && checkpoint_incomplete(entry.path().string()).empty())
      return true;
  return false;
}

std::vector<std::string> checkpoint_candidates(const std::string& path, ProcessGroup* group) {
  const fs::path p(path);
  const int rank = group ? group->rank() : 0;
  std::error_code ec;
  TESSEL_CHECK_AS(CheckpointError, fs::exists(p, ec), "checkpoint path '{}' does not exist", path);
  auto checked = [&](const std::string& dir) -> std::string {
    std::string why = checkpoint_incomplete(dir);
    // Every rank must choose the same folder: one rank's doubt rules it out for all.
    const bool ok = all_ok(group, why.empty());
    if (!ok && why.empty()) why = "another rank found it incomplete";
    return ok ? "" : why;
  };
  const bool is_step = fs::exists(p / kManifestFile, ec) || fs::exists(p / kTrainerFile, ec) ||
                       step_of_folder(p.filename().string()) >= 0;
  if (is_step) {
    if (rank == 0) remove_stale_temporaries(p.parent_path());  // what killed saves left beside it
    const std::string why = checked(p.string());
    TESSEL_CHECK_AS(CheckpointError, why.empty(), "checkpoint '{}' cannot be resumed from: {}", path, why);
    return {p.string()};
  }
  if (rank == 0) remove_stale_temporaries(p);
  std::vector<std::pair<int64_t, fs::path>> steps;  // by number: step-1000000 is newer than step-999999
  for (const auto& entry : fs::directory_iterator(p)) {
    const int64_t s = step_of_folder(entry.path().filename().string());
    if (s >= 0 && entry.is_directory()) steps.emplace_back(s, entry.path());
  }
  std::sort(steps.rbegin(), steps.rend());
  std::vector<std::string> out;
  for (const auto& [s, dir] : steps) {
    const std::string why = checked(dir.string());
    if (why.empty()) out.push_back(dir.string());
    else if (rank == 0) log_warn("skipping checkpoint {}: {}; trying an older one", dir.string(), why);
  }
  TESSEL_CHECK_AS(CheckpointError, !out.empty(), "no complete checkpoint (step-NNNNNN folder) under '{}'", path);
  return out;
}

std::string choose_checkpoint(const std::string& path, ProcessGroup* group, bool verify) {
  const int rank = group ? group->rank() : 0, ranks = group ? group->size() : 1;
  const std::vector<std::string> dirs = checkpoint_candidates(path, group);
  const bool one_step = dirs.size() == 1 && dirs.front() == fs::path(path).string();
  for (const std::string& dir : dirs) {
    if (!verify) return dir;
    std::string why;
    try {
      why = CheckpointReader(dir).verify(rank, ranks);
    } catch (const std::exception& e) {
      why = e.what();
    }
    // Every rank must choose the same folder: one rank's doubt rules it out for all.
    const bool ok = all_ok(group, why.empty());
    if (ok) return dir;
    if (why.empty()) why = "another rank found it damaged";
    TESSEL_CHECK_AS(CheckpointError, !one_step, "checkpoint '{}' cannot be resumed from: {}", path, why);
    if (rank == 0) log_warn("skipping checkpoint {}: {}; trying an older one", dir, why);
  }
  throw CheckpointError(fmt::format("no complete checkpoint (step-NNNNNN folder) under '{}'", path));
}

}  // namespace tessel
