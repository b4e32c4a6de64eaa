// Token datasets and the order in which training reads them. A dataset is a flat sequence
// of N token ids: raw text read as bytes (vocab 256), or a nanoGPT-style train.bin of
// little-endian uint16/uint32 ids, memory-mapped. A sample of sequence length S is S+1
// consecutive tokens (inputs, and targets shifted by one). Which sample is row j of step k
// depends only on (seed, k, j), never on the layout that reads it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tessel {

enum class TokenFormat { text, uint16, uint32 };
// "text", "uint16", "uint32"; throws naming the text.
TokenFormat parse_token_format(std::string_view text);
std::string_view token_format_name(TokenFormat format);
// Bytes per token in a file of this format: 1, 2 or 4.
int64_t token_width(TokenFormat format);

class TokenDataset {
 public:
  // Opens `path` (text is read into memory as bytes; binary formats are mapped). Throws
  // InputError naming the path when it is missing, not a regular file (a pipe, a device, a
  // folder: refused without opening it), empty, or not a whole number of tokens.
  static TokenDataset open(const std::string& path, TokenFormat format);
  // A dataset over tokens held in memory (tests, generated data).
  static TokenDataset from_tokens(std::vector<uint32_t> tokens);

  // Tokens [begin, end) as a dataset of their own, sharing the bytes (a held-out tail for
  // validation); throws unless 0 <= begin < end <= size().
  TokenDataset slice(int64_t begin, int64_t end) const;

  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Token i (0 <= i < size()).
  int64_t token(int64_t i) const;
  // Tokens [start, start + count) into `out`; throws when the range leaves the dataset.
  void read(int64_t start, int64_t count, int64_t* out) const;
  // The largest token id (computed once; used to check the model's vocabulary).
  int64_t max_token() const;

 private:
  std::string path_;
  TokenFormat format_ = TokenFormat::text;
  std::shared_ptr<const void> data_;  // owns the bytes or the mapping
  const uint8_t* bytes_ = nullptr;
  int64_t size_ = 0;
  mutable int64_t max_token_ = -1;
};

enum class SampleOrder { random, sequential };
// "random", "sequential"; throws naming the text.
SampleOrder parse_sample_order(std::string_view text);
std::string_view sample_order_name(SampleOrder order);

// Where each sample starts. random: uniform over [0, N-S-1) from (seed, step, row);
// sequential: ((step·B + row)·S) mod (N − S − 1), B the global batch.
class Sampler {
 public:
  // Throws InputError when the dataset is too short for one sample of `seq_len`.
  Sampler(int64_t num_tokens, int64_t seq_len, int64_t global_batch, SampleOrder order, uint64_t seed);
  int64_t start(int64_t step, int64_t row) const;
  int64_t seq_len() const { return seq_len_; }
  int64_t global_batch() const { return global_batch_; }

 private:
  int64_t span_;  // starts drawn from [0, span): N - S - 1 (of the N - S valid ones), or 1 when N = S + 1
  int64_t seq_len_, global_batch_;
  SampleOrder order_;
  uint64_t seed_;
};

// Byte-level tokenizer: each byte of UTF-8 text is one token (vocab 256).
struct ByteTokenizer {
  static constexpr int64_t kVocab = 256;
  static std::vector<int64_t> encode(std::string_view text);
  static std::string decode(const std::vector<int64_t>& tokens);
};

}  // namespace tessel
