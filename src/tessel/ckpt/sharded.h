// Distributed checkpoints: every rank writes only its own pieces of the run's tensors, straight
// into shared safetensors files whose layout every rank computes alike, and reads back only the
// byte ranges its own pieces need — in whatever layout it now has. The files are ordinary
// Hugging Face safetensors (whole tensors, Hugging Face names, a standard
// model.safetensors.index.json when there are several), so tools that read Hugging Face
// checkpoints read a tessel checkpoint as it is; checkpoint.json adds what they do not need:
// the placements each tensor was saved with, where every piece lives and its checksum.
//
// A step folder is published only when complete: written as DIR/.step-NNNNNN.tmp, every file
// and the folder fsync'd, manifest.json (each file's size) written last, renamed to
// DIR/step-NNNNNN and DIR fsync'd. A write error on any rank fails the save on every rank
// (naming the rank, the file and the system's error) and publishes nothing. See docs/checkpoint.md.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessel/comm/process_group.h"
#include "tessel/core/json.h"
#include "tessel/core/tensor.h"

namespace tessel {

// One tensor of a checkpoint as this rank holds it.
struct CheckpointTensor {
  std::string name;  // its name in the files (Hugging Face's for the model's parameters)
  Tensor value;      // plain: the whole tensor; distributed: this rank's piece of it
  Shape file_shape;  // the shape the files hold it in (the same elements, row-major); empty: value's
};

// What a save writes. Each group becomes its own safetensors files: "model" →
// model.safetensors, or model-00001-of-0000N.safetensors + model.safetensors.index.json.
struct CheckpointContent {
  int64_t step = 0;
  std::map<std::string, std::vector<CheckpointTensor>> groups;
  Json trainer = Json::Object{};  // trainer.json (rank 0's is written; "step" is set)
};

struct CheckpointSaveOptions {
  int keep_last = 0;  // > 0: after publishing, remove all but the newest keep_last step folders
  int threads = 4;    // writer threads per rank
  // The machine of every rank (folder_machines, peer_copies.h) when the ranks do not all see
  // `dir` as one folder — an in-memory checkpoint in each machine's own tmpfs: each machine's
  // folder gets its own ranks' pieces and, sent over the group, a peer copy of the pieces of the
  // machine before it (a synchronous save only). Empty: every rank writes into one folder.
  std::vector<int> machines;
};

// Collective over `group` (null: this process alone): writes DIR/step-NNNNNN/ and returns its
// path on every rank, or throws CheckpointError on every rank. Tensors held by several ranks
// (replicas) are written once, by the lowest rank holding the piece. Stale temporary folders of
// earlier, killed saves are removed first.
std::string save_sharded_checkpoint(const std::string& dir, const CheckpointContent& content, ProcessGroup* group,
                                    const CheckpointSaveOptions& options = {});

// A save in its three phases, for saving in the background: the constructor (collective, on
// the rank's own thread) plans the files and takes this rank's pieces — copies of them with
// `snapshot`, else the tensors themselves; write() writes this rank's pieces and syncs them (no
// communication: it may run on another thread); release_tensors() (on the rank's thread, while
// write() runs) makes the pieces the writer has not reached yet private copies and waits for
// the ones it is writing, after which the tensors may change; publish() (collective, on the
// rank's thread) records every piece and publishes the step folder, or throws on every rank.
class PendingCheckpoint {
 public:
  PendingCheckpoint(const std::string& dir, const CheckpointContent& content, ProcessGroup* group,
                    const CheckpointSaveOptions& options, bool snapshot);
  ~PendingCheckpoint();
  PendingCheckpoint(PendingCheckpoint&&) noexcept;
  PendingCheckpoint& operator=(PendingCheckpoint&&) noexcept;

  int64_t step() const;
  // A write error is kept and reported by publish() on every rank. With `stage_first` (a write on
  // a background thread while training goes on) every piece is first copied off the live tensors
  // into the writer's memory, so release_tensors() finds almost nothing left to copy or wait for.
  void write(bool stage_first = false);
  void release_tensors();
  std::string publish();   // writes first if write() was not called

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A 64-bit checksum of `n` bytes (tessel's own, 4 lanes of multiply-rotate; documented in
// docs/checkpoint.md so other tools can check a piece).
uint64_t checkpoint_checksum(const void* data, size_t n);

// A published step folder, opened for reading: the safetensors headers of its files (no data
// read) and its checkpoint.json.
class CheckpointReader {
 public:
  // Throws CheckpointError naming the folder and file when a file is missing or malformed.
  explicit CheckpointReader(const std::string& step_dir);

  const std::string& dir() const { return dir_; }
  const Json& trainer() const { return trainer_; }
  int64_t step() const;
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // The shape and safetensors dtype the files hold `name` in; throws naming it when absent.
  const Shape& shape(const std::string& name) const;
  const std::string& dtype(const std::string& name) const;
  // Every tensor name in the files.
  std::vector<std::string> names() const;
  // The group a tensor is in: its file's name up to the first '-' or '.' ("model", "optimizer").
  std::string group(const std::string& name) const;

  // Fills this rank's piece of every target from the files, reading only the bytes of that
  // piece (`threads` readers). The file's tensor must have the target's number of elements and,
  // when a target gives one, its file_shape; its dtype is converted to the target's. Throws
  // CheckpointError naming the file and the tensor otherwise.
  void read(const std::vector<CheckpointTensor>& targets, int threads = 4);
  // read(), collectively over `group` (null: alone), checking every saved piece the ranks read
  // against its checksum: a piece that lies inside a rank's box is checked from the bytes that
  // rank read; one that ranks read only in part is read whole by one rank (round-robin) and
  // checked. Pieces no rank reads are not needed and not checked. "" when every piece matched,
  // else what did not (the same text on every rank); the targets are then unusable.
  std::string read_verified(const std::vector<CheckpointTensor>& targets, ProcessGroup* group, int threads = 4);
  // Bytes of tensor data this reader has read from the files (checks included).
  int64_t bytes_read() const { return bytes_read_; }

  // Checks the pieces numbered i ≡ rank (mod ranks) of checkpoint.json against their
  // checksums, reading them: "" when they match, else what did not. With ranks = 1, every piece.
  std::string verify(int rank, int ranks);

 private:
  struct Where;
  struct SavedPiece;
  struct Verification;
  void read_into(const std::vector<CheckpointTensor>& targets, int threads, Verification* verify);
  // The saved pieces of checkpoint.json in name order, bounds-checked; throws Error on a bad index.
  std::vector<SavedPiece> saved_pieces() const;
  // Reads each of `pieces` whole and checks its checksum: "" or the first mismatch.
  std::string check_pieces(const std::vector<const SavedPiece*>& pieces);
  std::string dir_;
  Json trainer_, index_;
  std::map<std::string, std::shared_ptr<Where>> where_;
  int64_t bytes_read_ = 0;
};

// Whether a step folder is complete: its manifest.json lists files that all exist with their
// recorded sizes (a folder from before manifests: trainer.json parses and every safetensors
// header is whole). "" when complete, else why not.
std::string checkpoint_incomplete(const std::string& step_dir);

// N of a folder named step-N (digits only), else -1.
int64_t checkpoint_step_of(const std::string& folder_name);

// Whether `dir` holds a complete step folder (no checksums read).
bool has_complete_checkpoint(const std::string& dir);

// The step folders that are complete, newest first, collectively over `group` (null: alone):
// `path` itself when it is a step folder (throws CheckpointError unless complete), else those
// under it; newer incomplete ones are skipped with a warning naming why. Throws CheckpointError
// when there is none. No piece is read (see CheckpointReader::read_verified).
std::vector<std::string> checkpoint_candidates(const std::string& path, ProcessGroup* group);

// The step folder to resume from, collectively over `group` (null: alone): `path` itself when it
// is a step folder (it must be complete), else the newest complete step folder under it whose
// pieces match their checksums (each rank checks its share) — newer incomplete or damaged ones
// are skipped with a warning naming why. Throws CheckpointError when there is none.
std::string choose_checkpoint(const std::string& path, ProcessGroup* group, bool verify = true);

}  // namespace tessel
