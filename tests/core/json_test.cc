// JSON: round trips, integer preservation, escapes, and rejection of malformed text.
#include <gtest/gtest.h>

#include <cmath>

#include "tessel/core/error.h"
#include "tessel/core/json.h"

namespace tessel {
namespace {

TEST(Json, ParsesAndDumpsRoundTrip) {
  Json j = Json::parse(R"( {"b": [1, 2.5, "x", true, null], "a": {"n": -7}, "big": 9007199254740993} )");
  EXPECT_EQ(j.at("a").at("n").as_int(), -7);
  EXPECT_EQ(j.at("b").as_array().size(), 5u);
  EXPECT_EQ(j.at("b").as_array()[1].as_double(), 2.5);
  EXPECT_EQ(j.at("big").as_int(), 9007199254740993);  // beyond 2^53 survives as an integer
  EXPECT_EQ(j.dump(), R"({"a":{"n":-7},"b":[1,2.5,"x",true,null],"big":9007199254740993})");
  EXPECT_EQ(Json::parse(j.dump()).dump(), j.dump());
}

// Found by fuzz/json_fuzz.cc: -0.0 was written "-0", which reads back as the integer 0.
TEST(Json, NegativeZeroKeepsItsSignThroughDumpAndParse) {
  const Json back = Json::parse(Json(-0.0).dump());
  ASSERT_FALSE(back.is_int());
  EXPECT_TRUE(std::signbit(back.as_double()));
  EXPECT_EQ(Json::parse("[-0e-300]").dump(), Json::parse(Json::parse("[-0e-300]").dump()).dump());
}

TEST(Json, Escapes) {
  Json j = Json::parse(R"("a\"b\\c\n\u00e9\ud83d\ude00")");
  EXPECT_EQ(j.as_string(), "a\"b\\c\n\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(json_quote("q\"\n\x01"), "\"q\\\"\\n\\u0001\"");
}

TEST(Json, KeepsUtf8AndZeroes) {
  EXPECT_EQ(Json::parse("\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"").as_string(), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(Json::parse("[0, -0, 0.5, 10]").dump(), "[0,0,0.5,10]");
}

TEST(Json, ErrorsShowOtherBytesEscaped) {
  try {
    Json::parse(std::string("{\"a\":\0\x01}", 7));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("near '\\x00\\x01'"), std::string::npos) << e.what();
  }
}

TEST(Json, RejectsMalformedText) {
  for (const char* bad : {"", "{", "[1,", "{\"a\" 1}", "{\"a\":1,}", "tru", "\"abc", "01x", "{\"a\":1}{",
                          "[\"\x01\"]", "{\"k\":1,\"k\":2}", "\"\\q\"",
                          // leading zeros; lone or misordered surrogates; bytes that are not UTF-8
                          "002", "[-01]", "\"\\ud800\"", "\"\\ud800\\u0041\"", "\"\\udc00\\ud800\"",
                          "\"\xff\"", "\"\xc3\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\""}) {
    EXPECT_THROW(Json::parse(bad), Error) << bad;
  }
  std::string deep(300, '[');
  EXPECT_THROW(Json::parse(deep), Error);
  try {
    Json::parse("{\"a\": [1, 2,, 3]}");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("offset 12"), std::string::npos) << e.what();
  }
}

TEST(Json, TypeErrorsNameTheType) {
  Json j = Json::parse("{\"a\": \"s\"}");
  EXPECT_THROW(j.at("a").as_int(), Error);
  EXPECT_THROW(j.at("missing"), Error);
  EXPECT_THROW(Json::parse("1.5").as_int(), Error);
}

}  // namespace
}  // namespace tessel
