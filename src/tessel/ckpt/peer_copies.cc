// In-memory checkpoints held by peer machines (peer_copies.h): which ranks share a folder, whose
// peer copies a rank holds, and, before a resume, gathering the step the machines left hold
// whole — copying to each machine the pieces it lacks from one that has them.
#include "tessel/ckpt/peer_copies.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "tessel/ckpt/piece_io.h"
#include "tessel/ckpt/safetensors.h"
#include "tessel/ckpt/sharded.h"
#include "tessel/core/log.h"

namespace tessel {

using namespace ckpt_io;

namespace {

// Tags of the copies made before a resume (4 per transfer), apart from the pipeline's and the
// save's peer copies.
constexpr int kFillTag = 0x7D000000;

std::string ranks_str(const std::set<int>& ranks) {
  std::string out;
  for (int r : ranks) {
    if (!out.empty()) out += ',';
    out += std::to_string(r);
  }
  return out;
}

std::set<int> int_set(const Json& j) {
  std::set<int> out;
  for (const Json& v : j.as_array()) out.insert(static_cast<int>(v.as_int()));
  return out;
}

Json json_of(const std::set<int>& s) {
  Json::Array a;
  for (int v : s) a.emplace_back(static_cast<int64_t>(v));
  return Json(std::move(a));
}

// The saving ranks that wrote a piece of checkpoint.json's tensors.
std::set<int> piece_writers(const Json& index) {
  std::set<int> out;
  for (const auto& [name, t] : index.at("tensors").as_object())
    for (const Json& p : t.at("pieces").as_array()) out.insert(static_cast<int>(p.at("rank").as_int()));
  return out;
}

// One step folder of this machine whose files are whole: the saving ranks whose pieces it holds
// as their own machine's and as peer copies. `id` (checkpoint.json's checksum) tells one save
// from another of the same step (an earlier round's).
struct LocalStep {
  int64_t step = 0;
  std::string id;
  std::set<int> writers, own, peer;
};

std::vector<LocalStep> local_steps(const std::string& dir) {
  std::vector<LocalStep> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t step = step_of_folder(e.path().filename().string());
    if (step < 0 || !e.is_directory() || !checkpoint_files_incomplete(e.path().string()).empty()) continue;
    try {
      const Json manifest = Json::parse(read_text(e.path() / kManifestFile));
      const std::string index_text = read_text(e.path() / kIndexFile);
      LocalStep s;
      s.step = step;
      s.id = hex64(checkpoint_checksum(index_text.data(), index_text.size()));
      s.writers = piece_writers(Json::parse(index_text));
      if (const Json* mc = manifest.find("memory_copies")) {
        s.own = int_set(mc->at("own"));
        s.peer = int_set(mc->at("peer"));
      } else {
        s.own = s.writers;
      }
      out.push_back(std::move(s));
    } catch (const std::exception&) {
      // not a step this machine can offer
    }
  }
  return out;
}

// Calls fn(file path, byte offset in the file, bytes) for every row run of every piece that a
// rank of `writers` saved, in checkpoint.json's order — the same on every machine holding the step.
template <typename F>
void for_each_piece_run(const fs::path& folder, const std::set<int>& writers, F&& fn) {
  const Json index = Json::parse(read_text(folder / kIndexFile));
  std::map<std::string, SafetensorsFile> files;
  for (const auto& [name, t] : index.at("tensors").as_object()) {
    const std::string file = t.at("file").as_string();
    TESSEL_CHECK_AS(CheckpointError, file.find('/') == std::string::npos, "checkpoint '{}': tensor \"{}\" names file '{}'",
                    folder.string(), name, file);
    const std::string path = (folder / file).string();
    auto it = files.find(file);
    if (it == files.end()) it = files.emplace(file, SafetensorsFile::open(path)).first;
    const SafetensorsEntry& entry = it->second.entry(name);
    const uint64_t es = safetensors_dtype_size(t.at("dtype").as_string());
    const uint64_t base = it->second.data_start() + entry.begin;
    const Json* layout = t.find("layout_shape");
    const Shape shape = json_shape(layout ? *layout : t.at("shape"));
    for (const Json& p : t.at("pieces").as_array()) {
      if (!writers.count(static_cast<int>(p.at("rank").as_int()))) continue;
      for_each_run(shape, json_shape(p.at("offset")), json_shape(p.at("extent")),
                   [&](int64_t at, int64_t, int64_t count) {
                     fn(path, base + static_cast<uint64_t>(at) * es, static_cast<uint64_t>(count) * es);
                   });
    }
  }
}

// What a machine that lacks a step altogether needs to hold it: every file's size, the
// safetensors headers and the small JSON files (the manifest last, written once filled).
std::string skeleton_of(const fs::path& folder) {
  Json manifest = Json::parse(read_text(folder / kManifestFile));
  Json files = Json::Object{};
  for (const auto& [name, e] : manifest.at("files").as_object()) {
    Json f = Json::Object{};
    f["size"] = e.at("size").as_int();
    const std::string text = read_text(folder / name);
    if (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0) {
      uint64_t n = 0;
      TESSEL_CHECK_AS(CheckpointError, text.size() >= 8, "checkpoint: '{}' has no header", (folder / name).string());
      std::memcpy(&n, text.data(), 8);
      TESSEL_CHECK_AS(CheckpointError, n <= text.size() - 8, "checkpoint: '{}' has a truncated header",
                      (folder / name).string());
      f["header"] = text.substr(8, n);
    } else {
      f["text"] = text;
    }
    files[name] = std::move(f);
  }
  Json out = Json::Object{};
  out["manifest"] = std::move(manifest);
  out["files"] = std::move(files);
  return out.dump();
}

void write_skeleton(const fs::path& folder, const std::string& skeleton) {
  const Json s = Json::parse(skeleton);
  for (const auto& [name, f] : s.at("files").as_object()) {
    TESSEL_CHECK_AS(CheckpointError, name.find('/') == std::string::npos && name != ".." && name != ".",
                    "checkpoint copy: '{}' is not a file of the folder", name);
    if (const Json* text = f.find("text")) {
      write_durable(folder / name, text->as_string());
      continue;
    }
    const std::string header = f.at("header").as_string();
    const uint64_t n = header.size();
    std::string head(8, '\0');
    std::memcpy(head.data(), &n, 8);
    head += header;
    const std::string path = (folder / name).string();
    const int fd = open_or_throw(path, O_WRONLY | O_CREAT);
    TESSEL_CHECK_AS(CheckpointWriteError, ::ftruncate(fd, static_cast<off_t>(f.at("size").as_int())) == 0,
                    "checkpoint: cannot size '{}': {}", path, sys_error());
    pwrite_all(fd, head.data(), head.size(), 0, path);
    fsync_or_throw(fd, path);
    close_or_throw(fd, path);
  }
}

// A blob over the group: its length (-1: the sender could not read its copy), then its bytes.
void send_blob(ProcessGroup& g, const std::optional<std::string>& blob, int dst, int tag) {
  int64_t n = blob ? static_cast<int64_t>(blob->size()) : -1;
  g.send(&n, 1, DType::i64, dst, tag);
  if (n > 0) g.send(blob->data(), n, DType::b8, dst, tag + 1);
}

std::optional<std::string> recv_blob(ProcessGroup& g, int src, int tag) {
  int64_t n = 0;
  g.recv(&n, 1, DType::i64, src, tag);
  if (n < 0) return std::nullopt;
  std::string blob(static_cast<size_t>(n), '\0');
  if (n > 0) g.recv(blob.data(), n, DType::b8, src, tag + 1);
  return blob;
}

}  // namespace

std::vector<int> folder_machines(const std::string& dir, ProcessGroup* group) {
  const int world = group ? group->size() : 1, rank = group ? group->rank() : 0;
  if (world == 1) return {0};
  std::error_code ec;
  fs::create_directories(dir, ec);
  // Every rank leaves a mark named by this call (rank 0's nonce) and its rank; then each looks
  // for every rank's mark in the folder it sees. A rank that cannot write there is alone.
  std::string nonce = fmt::format("{:016x}", (static_cast<uint64_t>(std::random_device{}()) << 32) ^
                                                 std::random_device{}() ^ static_cast<uint64_t>(::getpid()));
  nonce = gather_text(group, nonce).front();
  auto mark = [&](int r) { return fs::path(dir) / fmt::format(".tessel-machine-{}-{}", nonce, r); };
  std::ofstream(mark(rank)) << rank << "\n";
  (void)all_ok(group, true);  // every mark is made
  int lowest = rank;
  for (int r = 0; r < rank; ++r)
    if (fs::exists(mark(r), ec)) {
      lowest = r;
      break;
    }
  const std::vector<std::string> all = gather_text(group, std::to_string(lowest));
  (void)all_ok(group, true);  // every rank has looked
  fs::remove(mark(rank), ec);
  std::vector<int> machines;
  for (const std::string& s : all) machines.push_back(std::stoi(s));
  return machines;
}

int machine_count(const std::vector<int>& machines) {
  return static_cast<int>(std::set<int>(machines.begin(), machines.end()).size());
}

int peer_copy_rank(const std::vector<int>& machines, int rank) {
  const std::set<int> names_set(machines.begin(), machines.end());
  const std::vector<int> names(names_set.begin(), names_set.end());
  if (names.size() < 2) return -1;
  auto members_of = [&](int m) {
    std::vector<int> out;
    for (size_t r = 0; r < machines.size(); ++r)
      if (machines[r] == m) out.push_back(static_cast<int>(r));
    return out;
  };
  const int mine = machines[static_cast<size_t>(rank)];
  const std::vector<int> here = members_of(mine);
  const size_t local = static_cast<size_t>(std::find(here.begin(), here.end(), rank) - here.begin());
  const size_t k = static_cast<size_t>(std::find(names.begin(), names.end(), mine) - names.begin());
  const std::vector<int> next = members_of(names[(k + 1) % names.size()]);
  return next[local % next.size()];
}

std::string memory_copy_missing(const Json& manifest, const std::string& step_dir) {
  const Json* mc = manifest.find("memory_copies");
  if (mc == nullptr) return "";
  std::set<int> held = int_set(mc->at("own")), missing;
  for (int r : int_set(mc->at("peer"))) held.insert(r);
  for (int r : piece_writers(Json::parse(read_text(fs::path(step_dir) / kIndexFile))))
    if (!held.count(r)) missing.insert(r);
  if (missing.empty()) return "";
  return fmt::format("it holds the pieces of saving ranks {} only (this machine's own and its peer copies); those of "
                     "ranks {} are in other machines' memory", ranks_str(held), ranks_str(missing));
}

std::vector<std::pair<int64_t, std::string>> memory_steps_held(const std::string& dir, ProcessGroup* group,
                                                               const std::vector<int>& machines, bool log,
                                                               int64_t at_least) {
  const int rank = group ? group->rank() : 0, world = group ? group->size() : 1;
  TESSEL_CHECK(static_cast<int>(machines.size()) == world, "memory_steps_held: {} machine names for {} ranks",
               machines.size(), world);
  Json::Array mine;
  for (const LocalStep& s : local_steps(dir)) {
    Json j = Json::Object{};
    j["step"] = s.step;
    j["id"] = s.id;
    j["writers"] = json_of(s.writers);
    j["own"] = json_of(s.own);
    j["peer"] = json_of(s.peer);
    mine.push_back(std::move(j));
  }
  const std::vector<std::string> listed = gather_text(group, Json(std::move(mine)).dump());

  // What each machine holds, from its lowest rank's listing (its ranks see the same folder).
  const std::set<int> names(machines.begin(), machines.end());
  auto members = [&](int m) {
    std::set<int> out;
    for (int r = 0; r < world; ++r)
      if (machines[static_cast<size_t>(r)] == m) out.insert(r);
    return out;
  };
  struct Held {
    std::set<int> writers;
    std::map<int, std::pair<std::set<int>, std::set<int>>> by_machine;  // machine -> (own, peer)
  };
  std::map<std::pair<int64_t, std::string>, Held, std::greater<>> steps;  // newest first
  for (int m : names) {
    const Json list = Json::parse(listed[static_cast<size_t>(m)]);
    for (const Json& j : list.as_array()) {
      Held& h = steps[{j.at("step").as_int(), j.at("id").as_string()}];
      h.writers = int_set(j.at("writers"));
      h.by_machine[m] = {int_set(j.at("own")), int_set(j.at("peer"))};
    }
  }
  auto holds = [](const Held& h, int m) {
    std::set<int> out;
    auto it = h.by_machine.find(m);
    if (it == h.by_machine.end()) return out;
    out = it->second.first;
    out.insert(it->second.second.begin(), it->second.second.end());
    return out;
  };

  const Held* chosen = nullptr;
  int64_t step = -1;
  for (const auto& [key, h] : steps) {
    if (key.first < at_least) break;
    std::set<int> missing = h.writers;
    for (int m : names)
      for (int r : holds(h, m)) missing.erase(r);
    if (missing.empty()) {
      chosen = &h;
      step = key.first;
      break;
    }
    if (log)
      log_warn("in-memory checkpoint step {}: the pieces of saving rank{} {} are in the memory of none of the {} "
               "machine{} left (the machine that wrote them and the one holding their peer copies are both gone); "
               "trying an older step", key.first, missing.size() == 1 ? "" : "s", ranks_str(missing), names.size(),
               names.size() == 1 ? "" : "s");
  }
  if (chosen == nullptr) {
    if (log && !steps.empty() && steps.begin()->first.first >= at_least)
      log_warn("no in-memory checkpoint is held whole by the machines left, so the run resumes from --save");
    return {};
  }

  // Each machine that lacks pieces (or the whole step) gets them from the first machine that
  // holds them: the lowest rank of one sends to the lowest rank of the other.
  struct Transfer {
    int from, to;
    std::set<int> writers;
    bool skeleton;
  };
  std::vector<Transfer> transfers;
  for (int t : names) {
    const std::set<int> have = holds(*chosen, t);
    bool skeleton = !chosen->by_machine.count(t);
    std::map<int, std::set<int>> by_source;
    for (int w : chosen->writers) {
      if (have.count(w)) continue;
      for (int s : names)
        if (holds(*chosen, s).count(w)) {
          by_source[s].insert(w);
          break;
        }
    }
    for (const auto& [s, ws] : by_source) {
      transfers.push_back({s, t, ws, skeleton});
      skeleton = false;
    }
  }
  if (log) {
    std::string parts;
    for (const auto& [m, held] : chosen->by_machine) {
      parts += fmt::format("{}the machine of rank{} {} holds the pieces of saving ranks {}", parts.empty() ? "" : "; ",
                           members(m).size() == 1 ? "" : "s", ranks_str(members(m)), ranks_str(held.first));
      if (!held.second.empty()) parts += fmt::format(" and peer copies of saving ranks {}", ranks_str(held.second));
    }
    log_info("in-memory checkpoint step {} is held whole by the {} machine{} left: {}", step, names.size(),
             names.size() == 1 ? "" : "s", parts);
  }

  const auto t0 = std::chrono::steady_clock::now();
  const fs::path step_dir = fs::path(dir) / fmt::format("step-{:06d}", step);
  const fs::path tmp = fs::path(dir) / fmt::format(".step-{:06d}.tmp", step);
  std::string error;
  std::optional<fs::path> filling;  // where this rank's machine receives: step_dir or, for a whole step, tmp
  std::string manifest_text;
  int64_t bytes = 0;
  for (size_t i = 0; i < transfers.size(); ++i) {
    const Transfer& x = transfers[i];
    const int tag = kFillTag + 4 * static_cast<int>(i);
    if (rank == x.from) {
      std::optional<std::string> skeleton, pieces;
      try {
        if (x.skeleton) skeleton = skeleton_of(step_dir);
        pieces.emplace();
        FdCache fds(O_RDONLY);
        for_each_piece_run(step_dir, x.writers, [&](const std::string& path, uint64_t at, uint64_t n) {
          const size_t was = pieces->size();
          pieces->resize(was + n);
          pread_all(fds.get(path), pieces->data() + was, n, at, path);
        });
        fds.finish(false);
      } catch (const std::exception& e) {
        error = fmt::format("rank {} could not read its copy of step {}: {}", rank, step, e.what());
        skeleton.reset();
        pieces.reset();
      }
      if (x.skeleton) send_blob(*group, skeleton, x.to, tag);
      send_blob(*group, pieces, x.to, tag + 2);
    } else if (rank == x.to) {
      std::optional<std::string> skeleton = x.skeleton ? recv_blob(*group, x.from, tag) : std::nullopt;
      const std::optional<std::string> pieces = recv_blob(*group, x.from, tag + 2);
      try {
        TESSEL_CHECK_AS(CheckpointError, pieces && (!x.skeleton || skeleton), "rank {} could not send its copy",
                        x.from);
        if (x.skeleton) {
          fs::remove_all(tmp);
          fs::create_directories(tmp);
          write_skeleton(tmp, *skeleton);
          manifest_text = Json::parse(*skeleton).at("manifest").dump();
          filling = tmp;
        } else if (!filling) {
          filling = step_dir;
          manifest_text = read_text(step_dir / kManifestFile);
        }
        size_t at = 0;
        FdCache fds(O_WRONLY);
        for_each_piece_run(*filling, x.writers, [&](const std::string& path, uint64_t off, uint64_t n) {
          TESSEL_CHECK_AS(CheckpointError, at + n <= pieces->size(), "the copy of step {} from rank {} is too short",
                          step, x.from);
          pwrite_all(fds.get(path), pieces->data() + at, n, off, path);
          at += n;
        });
        fds.finish(true);
        bytes += static_cast<int64_t>(at);
      } catch (const std::exception& e) {
        if (error.empty()) error = fmt::format("rank {}: {}", rank, e.what());
      }
    }
  }
  // The machine now holds every piece: its manifest says so (no "memory_copies") — written last,
  // so a crash while copying leaves the step incomplete here, never complete with holes.
  if (filling && error.empty()) {
    try {
      Json manifest = Json::parse(manifest_text);
      manifest.object().erase("memory_copies");
      if (*filling == tmp) {
        write_durable(tmp / kManifestFile, manifest.dump() + "\n");
        fsync_dir(tmp);
        fs::remove_all(step_dir);
        fs::rename(tmp, step_dir);
      } else {
        write_durable(step_dir / (std::string(kManifestFile) + ".new"), manifest.dump() + "\n");
        fs::rename(step_dir / (std::string(kManifestFile) + ".new"), step_dir / kManifestFile);
        fsync_dir(step_dir);
      }
      fsync_dir(dir);
    } catch (const std::exception& e) {
      error = fmt::format("rank {}: {}", rank, e.what());
    }
  }
  const bool ok = all_ok(group, error.empty());
  if (group) group->all_reduce(&bytes, 1, DType::i64, ReduceOp::sum);
  if (!ok) {
    if (log)
      log_warn("copying the in-memory checkpoint step {} between machines failed ({}), so the run resumes from --save",
               step, error.empty() ? "on another machine" : error);
    return {};
  }
  if (log && !transfers.empty()) {
    std::string what;
    for (const Transfer& x : transfers)
      what += fmt::format("{}the pieces of saving ranks {}{} from the machine of ranks {} to that of ranks {}",
                          what.empty() ? "" : "; ", ranks_str(x.writers), x.skeleton ? " (and the step's files)" : "",
                          ranks_str(members(x.from)), ranks_str(members(x.to)));
    log_info("copied {:.2f} MiB of in-memory checkpoint step {} between machines in {:.3f} s: {}",
             static_cast<double>(bytes) / (1 << 20), step,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), what);
  }
  return {{step, step_dir.string()}};
}

}  // namespace tessel
