// Token datasets, sample order and the byte tokenizer.
#include "tessel/data/dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "tessel/core/error.h"
#include "tessel/core/input_file.h"
#include "tessel/core/philox.h"

namespace tessel {

TokenFormat parse_token_format(std::string_view text) {
  if (text == "text") return TokenFormat::text;
  if (text == "uint16") return TokenFormat::uint16;
  if (text == "uint32") return TokenFormat::uint32;
  TESSEL_THROW("unknown data format '{}' (expected text, uint16 or uint32)", text);
}

std::string_view token_format_name(TokenFormat format) {
  return format == TokenFormat::text ? "text" : format == TokenFormat::uint16 ? "uint16" : "uint32";
}

int64_t token_width(TokenFormat format) {
  return format == TokenFormat::text ? 1 : format == TokenFormat::uint16 ? 2 : 4;
}

std::string_view sample_order_name(SampleOrder order) {
  return order == SampleOrder::random ? "random" : "sequential";
}

SampleOrder parse_sample_order(std::string_view text) {
  if (text == "random") return SampleOrder::random;
  if (text == "sequential") return SampleOrder::sequential;
  TESSEL_THROW("unknown sample order '{}' (expected random or sequential)", text);
}

TokenDataset TokenDataset::open(const std::string& path, TokenFormat format) {
  TokenDataset d;
  d.path_ = path;
  d.format_ = format;
  // Looked at before it is opened: opening a named pipe would wait for a writer forever. A token
  // file is memory-mapped, so only a regular file will do.
  check_input_file(path, "data file");
  // O_NONBLOCK: a path swapped for a pipe since the stat does not block here; fstat refuses it.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  TESSEL_CHECK_AS(InputError, fd >= 0, "data file '{}': cannot open: {}", path, std::strerror(errno));
  struct stat st{};
  int rc = ::fstat(fd, &st);
  size_t bytes = rc == 0 ? static_cast<size_t>(st.st_size) : 0;
  if (rc != 0 || !S_ISREG(st.st_mode) || bytes == 0) {
    const int err = errno;
    ::close(fd);
    throw InputError(fmt::format("data file '{}': {}", path,
                                 rc != 0                ? std::strerror(err)
                                 : !S_ISREG(st.st_mode) ? "is not a regular file (a token file is memory-mapped)"
                                                        : "is empty"));
  }
  const size_t width = static_cast<size_t>(token_width(format));
  if (bytes % width != 0) {
    ::close(fd);
    throw InputError(fmt::format("data file '{}': {} bytes is not a whole number of {}-byte tokens (format {})", path,
                                 bytes, width, token_format_name(format)));
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  TESSEL_CHECK(map != MAP_FAILED, "data file '{}': cannot map: {}", path, std::strerror(errno));
  d.data_ = std::shared_ptr<const void>(map, [bytes](const void* p) { ::munmap(const_cast<void*>(p), bytes); });
  d.bytes_ = static_cast<const uint8_t*>(map);
  d.size_ = static_cast<int64_t>(bytes / width);
  return d;
}

TokenDataset TokenDataset::from_tokens(std::vector<uint32_t> tokens) {
  TokenDataset d;
  d.path_ = "<memory>";
  d.format_ = TokenFormat::uint32;
  auto owned = std::make_shared<std::vector<uint32_t>>(std::move(tokens));
  d.bytes_ = reinterpret_cast<const uint8_t*>(owned->data());
  d.size_ = static_cast<int64_t>(owned->size());
  d.data_ = owned;
  return d;
}

TokenDataset TokenDataset::slice(int64_t begin, int64_t end) const {
  TESSEL_CHECK(0 <= begin && begin < end && end <= size_, "{}: token range [{}, {}) is not inside its {} tokens",
               path_, begin, end, size_);
  TokenDataset d = *this;
  d.bytes_ = bytes_ + begin * token_width(format_);
  d.size_ = end - begin;
  d.max_token_ = -1;
  return d;
}

int64_t TokenDataset::token(int64_t i) const {
  switch (format_) {
    case TokenFormat::text: return bytes_[i];
    case TokenFormat::uint16: {
      uint16_t v;
      std::memcpy(&v, bytes_ + 2 * i, 2);
      return v;
    }
    case TokenFormat::uint32: {
      uint32_t v;
      std::memcpy(&v, bytes_ + 4 * i, 4);
      return v;
    }
  }
  return 0;
}

void TokenDataset::read(int64_t start, int64_t count, int64_t* out) const {
  TESSEL_CHECK(start >= 0 && count >= 0 && start + count <= size_, "data file '{}': tokens [{}, {}) outside its {} tokens",
               path_, start, start + count, size_);
  for (int64_t i = 0; i < count; ++i) out[i] = token(start + i);
}

int64_t TokenDataset::max_token() const {
  if (max_token_ < 0) {
    int64_t m = 0;
    for (int64_t i = 0; i < size_; ++i) m = std::max(m, token(i));
    max_token_ = m;
  }
  return max_token_;
}

Sampler::Sampler(int64_t num_tokens, int64_t seq_len, int64_t global_batch, SampleOrder order, uint64_t seed)
    // A sample reads seq_len + 1 tokens, so N tokens have N - S valid starts; the span leaves out
    // the last of them (as it always has: the samples of every recorded run stay the same)
    // except where that one is the only start.
    : span_(num_tokens - seq_len == 1 ? 1 : num_tokens - seq_len - 1), seq_len_(seq_len), global_batch_(global_batch),
      order_(order), seed_(seed) {
  TESSEL_CHECK(seq_len > 0 && global_batch > 0, "data: seq_len ({}) and global_batch ({}) must be positive", seq_len,
               global_batch);
  TESSEL_CHECK_AS(InputError, span_ > 0,
                  "data: {} tokens are too few for samples of seq_len {} (a sample reads seq_len + 1 = {} tokens)",
                  num_tokens, seq_len, seq_len + 1);
}

int64_t Sampler::start(int64_t step, int64_t row) const {
  if (order_ == SampleOrder::sequential) {
    __int128 pos = (static_cast<__int128>(step) * global_batch_ + row) * seq_len_;
    return static_cast<int64_t>(pos % span_);
  }
  PhiloxBlock r = philox_at(seed_, stream_combine(stream_key("data.sample"), static_cast<uint64_t>(step)),
                            static_cast<uint64_t>(row));
  uint64_t x = (static_cast<uint64_t>(r[0]) << 32) | r[1];
  return static_cast<int64_t>(x % static_cast<uint64_t>(span_));
}

std::vector<int64_t> ByteTokenizer::encode(std::string_view text) {
  std::vector<int64_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& tokens) {
  std::string out;
  out.reserve(tokens.size());
  for (int64_t t : tokens) {
    TESSEL_CHECK(t >= 0 && t < kVocab, "byte tokenizer: token {} is not a byte", t);
    out += static_cast<char>(t);
  }
  return out;
}

}  // namespace tessel
