// safetensors files (https://huggingface.co/docs/safetensors): an 8-byte little-endian
// header length, a JSON header mapping each tensor name to {dtype, shape, data_offsets} plus
// an optional "__metadata__" object of strings, then the raw little-endian data. Reading is
// bounds-checked and strict — truncated files, malformed JSON, offsets outside the data,
// overlaps, gaps and size mismatches are rejected with a CheckpointError naming the file and
// the tensor — and zero-copy: tensors view a read-only mapping of the file when aligned.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessel/core/tensor.h"

namespace tessel {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // as in the file: F32, BF16, ...
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets in the data section
};

class SafetensorsFile {
 public:
  // Maps and validates `path`; throws CheckpointError.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Where the data section starts in the file (8 + the header's length): an entry's bytes are
  // at data_start() + begin .. data_start() + end.
  uint64_t data_start() const { return data_start_; }
  bool contains(const std::string& name) const;
  const SafetensorsEntry& entry(const std::string& name) const;
  // The tensor called `name` (F16 is widened to f32; other dtypes load as they are).
  Tensor load(const std::string& name) const;
  // Every tensor, by name.
  std::map<std::string, Tensor> load_all() const;

 private:
  std::string path_;
  std::shared_ptr<void> mapping_;  // keeps the file mapped while tensors view it
  const char* data_ = nullptr;     // start of the data section
  uint64_t data_size_ = 0;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (any layout; written contiguous, little-endian) and string metadata to
// `path` atomically: a temporary file in the same folder is renamed over the target.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// The bytes a safetensors file starts with: the 8-byte length, then the JSON header of
// `entries` (their data offsets as given) and `metadata`, padded with spaces so that the data
// starts 8-byte aligned. Throws CheckpointError naming `path` on a reserved or empty name.
std::string safetensors_header(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                               const std::map<std::string, std::string>& metadata);

// The size in bytes of one element of a file dtype ("F32" -> 4); throws on an unknown one.
size_t safetensors_dtype_size(const std::string& dtype);
// The tessel dtype a file dtype loads as without conversion (F16 has none: throws).
DType safetensors_tessel_dtype(const std::string& dtype);

// IEEE half-precision values widened to f32.
void widen_f16(const uint16_t* in, float* out, size_t n);

// File dtype name <-> tessel dtype (F32, F64, BF16, I32, I64, BOOL).
std::string safetensors_dtype(DType dtype);

}  // namespace tessel
