#include "core/json.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace nk {
namespace {

using nlohmann::json;
using test::contains;
using test::error_of;

int64_t int_of(const std::string& text, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) {
  return json_int(parse_json(text, "f.json"), "f.json", "k", lo, hi);
}

TEST(Json, IntegersMustBeIntegralAndInRange) {
  EXPECT_EQ(int_of("12"), 12);
  EXPECT_EQ(int_of("-3"), -3);
  EXPECT_EQ(int_of("4.0"), 4);  // integral: Python writes 4.0 for a float that is whole
  EXPECT_EQ(int_of("9223372036854775807"), INT64_MAX);
  EXPECT_EQ(int_of("-9223372036854775808"), INT64_MIN);
  EXPECT_EQ(error_of([] { int_of("1.9"); }), "f.json: field 'k' must be an integer, got 1.9");
  EXPECT_EQ(error_of([] { int_of("\"3\""); }), "f.json: field 'k' must be an integer, got \"3\"");
  EXPECT_EQ(error_of([] { int_of("true"); }), "f.json: field 'k' must be an integer, got true");
  // Past int64 as an unsigned integer, and as floats no cast may take.
  EXPECT_TRUE(contains(error_of([] { int_of("9223372036854775808"); }), "out of range"));
  EXPECT_TRUE(contains(error_of([] { int_of("1e30"); }), "out of range"));
  EXPECT_TRUE(contains(error_of([] { int_of("-1e19"); }), "out of range"));
  EXPECT_EQ(error_of([] { int_of("7", 0, 5); }), "f.json: field 'k' is out of range [0, 5], got 7");
  // Also for ordered objects (safetensors headers, checkpoint manifests).
  EXPECT_EQ(json_int(nlohmann::ordered_json::parse("[5]")[0], "w", "k"), 5);
}

TEST(Json, NumbersNoDoubleHoldsAreErrorsNamingFileLineAndKey) {
  const std::string msg = error_of([] {
    parse_json("{\"model\": \"m\",\n  \"layers\": [1, {\"n_layer\": 1e400}]}", "config.json");
  });
  EXPECT_EQ(msg,
            "config.json:2: not valid JSON (column 29, byte 44, key 'layers[1].n_layer'): the "
            "number 1e400 "
            "is beyond a double's range");
  EXPECT_FALSE(contains(msg, "json.exception")) << msg;
  EXPECT_TRUE(
      contains(error_of([] { parse_json("[0, 1, -1e999]", "f.json"); }),
               "f.json:1: not valid JSON (column 8, byte 8, key '[2]'): the number -1e999"));
}

TEST(Json, SyntaxErrorsNameLineColumnAndKeyInPlainWords) {
  const std::string msg = error_of([] { parse_json("{\"a\": {\"b\": tru}}", "cfg.json"); });
  EXPECT_TRUE(contains(msg, "cfg.json:1:"));
  EXPECT_TRUE(contains(msg, "key 'a.b'")) << msg;
  EXPECT_TRUE(contains(msg, "syntax error while parsing value")) << msg;
  EXPECT_FALSE(contains(msg, "json.exception")) << msg;
  EXPECT_FALSE(contains(msg, "last read")) << msg;
  EXPECT_FALSE(json_fault("{\"a\": [1, 2.5e300]}").has_value());
  const std::optional<JsonFault> f = json_fault("{\n\n  \"x\": }");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->line, 3u);
  EXPECT_EQ(f->path, "x");
}

TEST(Json, ADuplicateKeyTakesTheLastValue) {
  json j = parse_json("{\"a\": 1, \"b\": 2, \"a\": 3}", "f.json");
  EXPECT_EQ(j["a"], 3);
  nlohmann::ordered_json o = nlohmann::ordered_json::parse("{\"a\": 1, \"a\": 3}");
  EXPECT_EQ(o["a"], 3);
}

TEST(Json, ShapesAreBoundedListsOfSizes) {
  auto shape = [](const std::string& text) {
    return json_shape(parse_json(text, "m.json"), "m.json", "global_shape");
  };
  EXPECT_EQ(shape("[2, 3]"), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(shape("[]"), std::vector<int64_t>{});
  EXPECT_TRUE(contains(error_of([&] { shape("[-1]"); }), "out of range"));
  EXPECT_TRUE(contains(error_of([&] { shape("[1099511627776, 1099511627776]"); }), "overflows"));
  EXPECT_TRUE(contains(error_of([&] { shape("[70368744177664, 2]"); }), "beyond the limit"));
  EXPECT_TRUE(contains(error_of([&] { shape("{\"a\": 1}"); }), "must be a list"));
  EXPECT_TRUE(contains(error_of([&] { shape("[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]"); }),
                       "at most 16 sizes"));
}

}  // namespace
}  // namespace nk
