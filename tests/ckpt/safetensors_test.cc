// safetensors: write/read round trips, metadata, foreign dtypes, and every kind of malformed
// file rejected with a clear CheckpointError.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "tessel/ckpt/safetensors.h"
#include "tessel/core/philox.h"
#include "tessel/core/view.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("tessel_st_{}_{}", ::getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A raw file: 8-byte length, header text, then `data_bytes` bytes.
  std::string raw(const std::string& name, const std::string& header, size_t data_bytes, int64_t length_override = -1) {
    std::string p = path(name);
    std::ofstream out(p, std::ios::binary);
    uint64_t n = length_override >= 0 ? static_cast<uint64_t>(length_override) : header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out << header;
    out << std::string(data_bytes, '\0');
    return p;
  }

  std::string error_of(const std::string& p) {
    try {
      SafetensorsFile::open(p).load_all();
    } catch (const CheckpointError& e) {
      return e.what();
    }
    return "<no error>";
  }

  fs::path dir_;
};

TEST_F(Safetensors, RoundTripsEveryDtypeAndMetadata) {
  std::map<std::string, Tensor> in;
  Tensor w = Tensor::empty({3, 5}, DType::f32);
  rng_fill(w, Distribution::normal, 0, 1, 1, stream_key("w"));
  in["model.w"] = w;
  in["transposed"] = view::transpose(w, 0, 1);  // written contiguous
  in["d"] = Tensor::from_doubles({1.5, -2.25}, {2}, DType::f64);
  in["b"] = view::to_dtype(w, DType::bf16);
  in["i"] = Tensor::arange(7, DType::i64);
  in["j"] = Tensor::arange(3, DType::i32);
  in["m"] = Tensor::from_doubles({1, 0, 1}, {3}, DType::b8);
  in["empty"] = Tensor::zeros({0, 4});
  in["scalar"] = Tensor::scalar(3.0);
  save_safetensors(path("a.safetensors"), in, {{"format", "pt"}, {"step", "12"}});

  SafetensorsFile f = SafetensorsFile::open(path("a.safetensors"));
  EXPECT_EQ(f.metadata().at("step"), "12");
  EXPECT_EQ(f.entries().size(), in.size());
  for (const auto& [name, t] : in) {
    Tensor got = f.load(name);
    EXPECT_EQ(got.dtype(), t.dtype()) << name;
    EXPECT_EQ(got.shape(), t.shape()) << name;
    EXPECT_EQ(got.to_doubles(), t.to_doubles()) << name;
  }
  // Rewriting what was read gives the same bytes.
  save_safetensors(path("b.safetensors"), f.load_all(), f.metadata());
  std::ifstream a(path("a.safetensors"), std::ios::binary), b(path("b.safetensors"), std::ios::binary);
  std::string sa((std::istreambuf_iterator<char>(a)), {}), sb((std::istreambuf_iterator<char>(b)), {});
  EXPECT_EQ(sa, sb);
}

TEST_F(Safetensors, ReadsF16AsF32) {
  // 1.0, -2.0, 0.5, 65504 (max half), smallest subnormal
  std::string header = R"({"h":{"dtype":"F16","shape":[5],"data_offsets":[0,10]}})";
  std::string p = path("half.safetensors");
  {
    std::ofstream out(p, std::ios::binary);
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out << header;
    for (uint16_t h : {0x3c00, 0xc000, 0x3800, 0x7bff, 0x0001}) out.write(reinterpret_cast<const char*>(&h), 2);
  }
  Tensor t = SafetensorsFile::open(p).load("h");
  EXPECT_EQ(t.dtype(), DType::f32);
  EXPECT_EQ(t.to_doubles(), (std::vector<double>{1.0, -2.0, 0.5, 65504.0, std::ldexp(1.0, -24)}));
}

TEST_F(Safetensors, RejectsMalformedFiles) {
  const std::string ok_entry = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  struct Bad {
    const char* what;
    std::string file;
    const char* expect;
  };
  std::vector<Bad> cases = {
      {"empty header", raw("e", "", 0, 0), "not a JSON object"},
      {"short length field", [&] {
         std::string p = path("s");
         std::ofstream(p) << "abc";
         return p;
       }(), "truncated"},
      {"header past end", raw("h", "{" + ok_entry + "}", 8, 4096), "truncated"},
      {"huge header", raw("g", "{}", 0, int64_t{1} << 40), "limit"},
      {"bad json", raw("j", "{\"t\":{\"dtype\":\"F32\",", 8), "bad JSON"},
      {"not an object", raw("n", "[1,2]", 0), "not a JSON object"},
      {"offsets out of range", raw("o", R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4), "past the data"},
      {"size mismatch", raw("z", R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "needs 12"},
      {"overlap", raw("v", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12), "overlaps"},
      {"gap", raw("p", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), "belong to no tensor"},
      {"trailing bytes", raw("r", "{" + ok_entry + "}", 12), "cover 8"},
      {"unknown dtype", raw("u", R"({"t":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", 8), "unknown dtype"},
      {"negative shape", raw("ns", R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "negative"},
      {"reversed offsets", raw("ro", R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8), "begin <= end"},
      {"missing dtype", raw("md", R"({"t":{"shape":[2],"data_offsets":[0,8]}})", 8), "dtype"},
      {"metadata not strings", raw("mm", "{\"__metadata__\":{\"a\":1}," + ok_entry + "}", 8), "not a string"},
      // numel·size would wrap past 2^64 to a small byte count
      {"f64 numel overflow", raw("of", R"({"t":{"dtype":"F64","shape":[2305843009213693953],"data_offsets":[0,8]}})", 8),
       "too large"},
      {"f32 2^62", raw("o2", R"({"t":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0),
       "too large"},
      {"split dims", raw("o3", R"({"t":{"dtype":"F64","shape":[1152921504606846976,4],"data_offsets":[0,0]}})", 0),
       "too large"},
      // empty, but its strides would overflow
      {"zero then huge", raw("zh", R"({"t":{"dtype":"F32","shape":[0,4611686018427387904,4],"data_offsets":[0,0]}})", 0),
       "too large"},
      {"bool not 0/1", [&] {
         std::string p = raw("b", R"({"t":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})", 0);
         std::ofstream(p, std::ios::binary | std::ios::app) << std::string("\x01\x00\x02", 3);
         return p;
       }(), "byte 2 at element 2"},
      {"not utf-8", raw("nu", "{\"t\xff\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8), "UTF-8"},
  };
  for (const Bad& b : cases) {
    std::string msg = error_of(b.file);
    EXPECT_NE(msg.find(b.expect), std::string::npos) << b.what << ": " << msg;
    EXPECT_NE(msg.find(b.file), std::string::npos) << b.what << ": message should name the file: " << msg;
  }
  EXPECT_NE(error_of(path("does-not-exist")).find("cannot open"), std::string::npos);
}

TEST_F(Safetensors, UnsupportedDtypeFailsOnLoadNamingTheTensor) {
  std::string p = raw("u8", R"({"bytes":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 4);
  SafetensorsFile f = SafetensorsFile::open(p);  // a valid file...
  try {
    f.load("bytes");  // ...with a dtype tessel does not compute in
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("\"bytes\""), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("U8"), std::string::npos);
  }
  EXPECT_THROW(f.load("absent"), CheckpointError);
}

}  // namespace
}  // namespace tessel
