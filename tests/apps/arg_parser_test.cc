// CommandLine: --options bound to their fields with docs in one line, as
// config keys are; positional arguments; errors naming the command and option.
#include "apps/arg_parser.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "test_util.h"

namespace nk {
namespace {

using test::contains;
using test::error_of;

// The options of an imaginary command, bound the way every command binds its own.
struct Options {
  int64_t count = 10;
  int threads = 0;
  double lr = 0.1;
  bool verbose = false;
  std::string out;
  std::vector<std::string> inputs;
  bool given_out = false;

  std::vector<std::string> parse(const std::vector<std::string>& args) {
    CommandLine cl("demo", args, 1);
    bind(cl);
    return cl.finish();
  }
  void bind(CommandLine& cl) {
    cl.bind("--count", count, "tokens listed");
    cl.bind("--threads", threads, "threads (0 = all cores)");
    cl.bind("--lr", lr, "learning rate");
    cl.bind("--verbose", verbose, "say more");
    given_out = cl.bind("--out", out, "the file written (required)");
    cl.bind("--input", inputs, "files read");
  }
};

TEST(CommandLine, BoundFieldsTakeTheirOptionsAndKeepTheirDefaultsOtherwise) {
  Options o;
  std::vector<std::string> pos =
      o.parse({"demo", "SPEC", "--count", "3", "--lr=0.5", "-5", "--verbose", "--input", "a", "b",
               "--out", "x", "--count", "4", "-"});
  EXPECT_EQ(pos, (std::vector<std::string>{"SPEC", "-5", "-"}));  // "-5" and "-" are positional
  EXPECT_EQ(o.count, 4);                                          // given twice: the last wins
  EXPECT_EQ(o.lr, 0.5);
  EXPECT_TRUE(o.verbose);
  EXPECT_EQ(o.inputs, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(o.out, "x");
  EXPECT_TRUE(o.given_out);
  EXPECT_EQ(o.threads, 0);
  Options d;
  EXPECT_TRUE(d.parse({"demo"}).empty());
  EXPECT_FALSE(d.given_out);
  EXPECT_EQ(d.count, 10);
}

TEST(CommandLine, ErrorsNameTheCommandAndTheOption) {
  auto err = [](const std::vector<std::string>& args) {
    return error_of([&] {
      Options o;
      o.parse(args);
    });
  };
  EXPECT_EQ(err({"demo", "--cuont", "3"}),
            "demo: unknown option '--cuont' (did you mean '--count'?)");
  std::string e = err({"demo", "--zzzzzzzz"});
  EXPECT_TRUE(contains(e, "demo: unknown option '--zzzzzzzz' (options: --count --threads")) << e;
  EXPECT_EQ(err({"demo", "--count"}), "demo: option --count needs a value");
  EXPECT_EQ(err({"demo", "--count", "--verbose"}), "demo: option --count needs a value");
  EXPECT_EQ(err({"demo", "--verbose=yes"}), "demo: option --verbose takes no value");
  EXPECT_EQ(err({"demo", "--count", "many"}), "--count: 'many' is not an integer");
  EXPECT_EQ(err({"demo", "--lr", "fast"}), "--lr: 'fast' is not a number");
  EXPECT_EQ(err({"demo", "--threads", "9999999999"}),
            "demo: option --threads expects an int in -2147483648..2147483647, got '9999999999'");
}

TEST(CommandLine, HelpListsEveryOptionWithItsTypeDocAndDefault) {
  CommandLine cl("demo", {"demo", "--count", "oops", "--help"}, 1);
  Options o;
  o.bind(cl);  // --help: the options are declared, not read
  ASSERT_TRUE(cl.help());
  EXPECT_EQ(o.count, 10);
  std::string h = cl.help_text("usage: demo SPEC [options]\n");
  EXPECT_TRUE(contains(h, "usage: demo SPEC [options]\n\ndemo options:\n")) << h;
  EXPECT_TRUE(contains(h, "  --count INT     tokens listed (default 10)\n")) << h;
  EXPECT_TRUE(contains(h, "  --lr FLOAT      learning rate (default 0.1)\n")) << h;
  EXPECT_TRUE(contains(h, "  --verbose       say more\n")) << h;  // a flag: no value, no default
  EXPECT_TRUE(contains(h, "  --out STRING    the file written (required)\n")) << h;
  EXPECT_TRUE(contains(h, "  --input STRING  files read (one or more)\n")) << h;
}

}  // namespace
}  // namespace nk
