#include "data/utf8.h"

#include <gtest/gtest.h>

namespace nk {
namespace {

// Python: b.decode("utf-8", "backslashreplace") gives the same text.
TEST(Utf8Escape, EachBadByteAsBackslashXHex) {
  EXPECT_EQ(escape_invalid_utf8("plain h\xC3\xA9"), "plain h\xC3\xA9");
  EXPECT_EQ(escape_invalid_utf8("caf\xE9.txt"), "caf\\xe9.txt");
  EXPECT_EQ(escape_invalid_utf8("d\xFF\xFE"), "d\\xff\\xfe");
  EXPECT_EQ(escape_invalid_utf8("\xE2\x82"
                                "A"),
            "\\xe2\\x82A");  // a truncated sequence: each of its bytes
  EXPECT_EQ(escape_invalid_utf8("x\xF0\x9F\x98"), "x\\xf0\\x9f\\x98");
  EXPECT_EQ(escape_invalid_utf8(""), "");
}

}  // namespace
}  // namespace nk
