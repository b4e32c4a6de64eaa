// Data: file formats, the two sample orders, batches independent of how rows are split, the
// background loader, and errors naming the file.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "tessel/core/error.h"
#include "tessel/data/loader.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

std::string temp_file(const std::string& name, const std::string& bytes) {
  fs::path p = fs::temp_directory_path() / fmt::format("tessel_data_{}_{}", ::getpid(), name);
  std::ofstream(p, std::ios::binary) << bytes;
  return p.string();
}

TEST(Dataset, ReadsTextUint16AndUint32) {
  std::string text = temp_file("t.txt", "hello");
  TokenDataset t = TokenDataset::open(text, TokenFormat::text);
  EXPECT_EQ(t.size(), 5);
  EXPECT_EQ(t.token(1), 'e');
  std::string u16 = temp_file("a.bin", std::string("\x01\x00\xff\xff\x02\x01", 6));
  TokenDataset a = TokenDataset::open(u16, TokenFormat::uint16);
  EXPECT_EQ(a.size(), 3);
  EXPECT_EQ(a.token(1), 65535);
  EXPECT_EQ(a.token(2), 258);
  EXPECT_EQ(a.max_token(), 65535);
  std::string u32 = temp_file("b.bin", std::string("\x01\x00\x01\x00", 4));
  EXPECT_EQ(TokenDataset::open(u32, TokenFormat::uint32).token(0), 65537);
  for (const std::string& p : {text, u16, u32}) fs::remove(p);
}

// A held-out tail is the same tokens, with its own size and its own largest id.
TEST(Dataset, SliceIsARangeOfTheSameTokens) {
  std::string u16 = temp_file("s.bin", std::string("\x01\x00\xff\x00\x02\x00\x07\x00", 8));
  TokenDataset all = TokenDataset::open(u16, TokenFormat::uint16);
  TokenDataset tail = all.slice(2, 4);
  EXPECT_EQ(tail.size(), 2);
  EXPECT_EQ(tail.token(0), 2);
  EXPECT_EQ(tail.token(1), 7);
  EXPECT_EQ(tail.max_token(), 7);
  EXPECT_EQ(all.max_token(), 255);
  EXPECT_EQ(TokenDataset::from_tokens({5, 6, 7}).slice(1, 2).token(0), 6);
  EXPECT_THROW(all.slice(3, 3), Error);
  EXPECT_THROW(all.slice(0, 5), Error);
  fs::remove(u16);
}

TEST(Dataset, ErrorsNameTheFile) {
  std::string odd = temp_file("odd.bin", "abc");
  try {
    TokenDataset::open(odd, TokenFormat::uint16);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(odd), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("whole number"), std::string::npos);
  }
  fs::remove(odd);
  EXPECT_THROW(TokenDataset::open("/nonexistent/train.bin", TokenFormat::uint16), Error);
  // A folder given as the data path (data.path: data/ instead of data/train.bin).
  const std::string dir = fs::temp_directory_path().string();
  try {
    TokenDataset::open(dir, TokenFormat::uint16);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a folder, not a file"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_token_format("utf8"), Error);
  EXPECT_THROW(Sampler(9, 9, 1, SampleOrder::random, 0), Error);  // a sample reads 10 tokens
  // Exactly one sample's tokens are enough (issue 52: seq_len + 2 were asked for): every row starts at 0.
  const Sampler one(10, 9, 3, SampleOrder::random, 0);
  for (int64_t row = 0; row < 3; ++row) EXPECT_EQ(one.start(5, row), 0);
}

// Every fault of a data file is the user's to fix: an InputError (the CLI's exit status 2), never
// a plain Error (1). A named pipe or a device is refused by name without being opened: opening a
// pipe would wait for a writer forever.
TEST(Dataset, BadFilesAreInputErrorsAndPipesDoNotBlock) {
  const std::string empty = temp_file("empty.bin", ""), odd = temp_file("odd2.bin", "abc");
  const std::string fifo = (fs::temp_directory_path() / fmt::format("tessel_data_{}_fifo", ::getpid())).string();
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string long_name = "/tmp/" + std::string(5000, 'y');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {empty, "is empty"},
      {odd, "3 bytes is not a whole number of 2-byte tokens"},
      {"/nonexistent/train.bin", "no such file"},
      {fifo, "a named pipe, not a regular file"},
      {"/dev/zero", "a device, not a regular file"},
      {fs::temp_directory_path().string(), "a folder, not a file"},
      {long_name, "the name is longer than this system allows"}};
  for (const auto& [path, want] : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      TokenDataset::open(path, TokenFormat::uint16);
      ADD_FAILURE() << path << " opened";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("data file '"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0) << path;
  }
  EXPECT_THROW(Sampler(9, 9, 1, SampleOrder::random, 0), InputError);
  fs::remove(empty);
  fs::remove(odd);
  fs::remove(fifo);
}

TEST(Sampler, SequentialFollowsTheFormula) {
  const int64_t N = 1000, S = 16, B = 4;
  Sampler s(N, S, B, SampleOrder::sequential, 0);
  for (int64_t k : {0, 1, 7, 100})
    for (int64_t j = 0; j < B; ++j) EXPECT_EQ(s.start(k, j), ((k * B + j) * S) % (N - S - 1));
}

TEST(Sampler, RandomDependsOnlyOnSeedStepAndRow) {
  Sampler a(5000, 32, 8, SampleOrder::random, 11), b(5000, 32, 8, SampleOrder::random, 11);
  Sampler c(5000, 32, 8, SampleOrder::random, 12);
  int differ = 0;
  for (int64_t k = 0; k < 20; ++k)
    for (int64_t j = 0; j < 8; ++j) {
      int64_t st = a.start(k, j);
      EXPECT_EQ(st, b.start(k, j));
      EXPECT_GE(st, 0);
      EXPECT_LT(st, 5000 - 33);
      differ += st != c.start(k, j);
    }
  EXPECT_GT(differ, 150);
}

TEST(Loader, SlicesOfTheBatchEqualTheWholeBatchRows) {
  std::vector<uint32_t> toks(3000);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint32_t>(i % 251);
  auto data = std::make_shared<TokenDataset>(TokenDataset::from_tokens(toks));
  Sampler s(data->size(), 10, 6, SampleOrder::random, 3);
  DataLoader whole(data, s, {.start_step = 5});
  DataLoader half(data, s, {.first_row = 3, .rows = 3, .start_step = 5});
  for (int step = 5; step < 9; ++step) {
    Batch w = whole.next(), h = half.next();
    EXPECT_EQ(w.step, step);
    EXPECT_EQ(h.step, step);
    std::vector<int64_t> wi = w.inputs.to_vector<int64_t>(), hi = h.inputs.to_vector<int64_t>();
    EXPECT_EQ(std::vector<int64_t>(wi.begin() + 30, wi.end()), hi);
    std::vector<int64_t> wt = w.targets.to_vector<int64_t>();
    for (int r = 0; r < 6; ++r)
      for (int t = 0; t + 1 < 10; ++t) EXPECT_EQ(wt[r * 10 + t], wi[r * 10 + t + 1]);
  }
}

TEST(Loader, RejectsRowsOutsideTheBatch) {
  auto data = std::make_shared<TokenDataset>(TokenDataset::from_tokens(std::vector<uint32_t>(100, 1)));
  Sampler s(100, 4, 4, SampleOrder::sequential, 0);
  EXPECT_THROW(DataLoader(data, s, {.first_row = 3, .rows = 2}), Error);
}

TEST(ByteTokenizer, RoundTrips) {
  std::string text = "caf\xc3\xa9 \n";
  EXPECT_EQ(ByteTokenizer::decode(ByteTokenizer::encode(text)), text);
  EXPECT_EQ(ByteTokenizer::encode("A")[0], 65);
  EXPECT_THROW(ByteTokenizer::decode({300}), Error);
}

}  // namespace
}  // namespace tessel
