// The set-up of the README's two commands: `make quickstart` installs what
// building and running need and nothing the tests alone use (PyTorch,
// GoogleTest, fortunes, Python's docs, clang...), builds the nekton binary
// alone; `make test` adds the rest.
#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <string>

#include "test_paths.h"
#include "test_util.h"

namespace nk {
namespace {

using test::contains;
using test::run_command;

std::set<std::string> packages(const std::string& flags) {
  const auto r =
      run_command(fmt::format("bash {}/scripts/setup.sh {} --list", NK_SOURCE_DIR, flags));
  EXPECT_EQ(r.code, 0) << r.out;
  std::set<std::string> out;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.insert(line);
  return out;
}

const char* kTestOnly[] = {"python3-torch", "python3-numpy",       "python3.11-doc",
                           "fortunes",      "fortunes-de",         "libgtest-dev",
                           "libgmock-dev",  "libbenchmark-dev",    "clang",
                           "llvm",          "clang-format",        "sentencepiece",
                           "fasttext",      "debian-reference-en", "ccache"};

TEST(SetupScript, QuickstartInstallsNoTestOnlyPackage) {
  const std::set<std::string> run = packages(""), test = packages("--test");
  for (const char* p : kTestOnly) {
    EXPECT_EQ(run.count(p), 0u) << p << " is installed by make quickstart's set-up";
    EXPECT_EQ(test.count(p), 1u) << p << " is missing from make test's set-up";
  }
  // What building and running need is in both.
  for (const char* p : {"cmake", "pkg-config", "libdnnl-dev", "libopenmpi-dev", "dict-gcide"}) {
    EXPECT_EQ(run.count(p), 1u) << p;
    EXPECT_EQ(test.count(p), 1u) << p;
  }
  for (const std::string& p : run) EXPECT_EQ(test.count(p), 1u) << p;
}

TEST(SetupScript, MakeQuickstartBuildsTheBinaryAloneWithoutTheTestSetup) {
  const auto r = run_command(fmt::format("make -n -C {} quickstart", NK_SOURCE_DIR));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "scripts/setup.sh")) << r.out;
  EXPECT_FALSE(contains(r.out, "--test")) << r.out;
  EXPECT_TRUE(contains(r.out, "-DNK_TESTS=OFF")) << r.out;
  EXPECT_TRUE(contains(r.out, "--target nekton")) << r.out;
  EXPECT_TRUE(contains(r.out, "-DCMAKE_UNITY_BUILD=ON")) << r.out;
  const auto t = run_command(fmt::format("make -n -C {} test", NK_SOURCE_DIR));
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_TRUE(contains(t.out, "scripts/setup.sh --test")) << t.out;
  // The same unity objects as quickstart's: CI's `make quickstart-build`
  // after `make test` in one folder only links the binary.
  EXPECT_TRUE(contains(t.out, "-DCMAKE_UNITY_BUILD=ON")) << t.out;
}

TEST(SetupScript, AnUnknownOptionIsRefused) {
  const auto r = run_command(fmt::format("bash {}/scripts/setup.sh --tset", NK_SOURCE_DIR));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.out, "usage: scripts/setup.sh")) << r.out;
}

}  // namespace
}  // namespace nk
