#include "core/atomic_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "test_util.h"

namespace nk {
namespace {

TEST(AtomicFile, TemporaryNamesFollowOneConvention) {
  std::string tmp = temporary_path("/x/latest");
  EXPECT_EQ(tmp, "/x/latest.tmp." + std::to_string(::getpid()));
  EXPECT_TRUE(is_temporary_name(std::filesystem::path(tmp).filename().string()));
  EXPECT_TRUE(is_temporary_name("shard_00001.jsonl.tmp.12"));
  EXPECT_FALSE(is_temporary_name("shard_00001.jsonl"));
  EXPECT_FALSE(is_temporary_name("notes.tmp.txt"));
  EXPECT_FALSE(is_temporary_name("a.tmp."));
  EXPECT_FALSE(is_temporary_name(".tmp.step_00000020.12345x"));
}

TEST(AtomicFile, ReplacesWholeAndLeavesNoTemporary) {
  test::TempDir dir("nk_atomic");
  write_file_atomic(dir / "f", "old");
  write_file_atomic(dir / "f", "new contents");
  EXPECT_EQ(test::read_file(dir / "f"), "new contents");
  {
    AtomicFileWriter w(dir / "g");
    w.write("partial", 7);
  }  // never committed: no g, no temporary
  EXPECT_EQ(dir.files(), std::vector<std::string>{"f"});
}

}  // namespace
}  // namespace nk
