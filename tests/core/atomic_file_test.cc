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

// What killed writers of PATH left, and only that: a prefix's files, a folder
// and the folder an interrupted install_folder moved aside; with `within`,
// temporaries anywhere inside PATH too.
TEST(AtomicFile, RemovesStaleTemporariesOfOnePathOnly) {
  test::TempDir dir("nk_stale");
  namespace fs = std::filesystem;
  for (const char* f : {"p.bin.tmp.11", "p.idx.tmp.12", "p.bin", "p.binx.tmp.13", "p.tmp.txt",
                        "q.bin.tmp.14", "out.old.tmp.15"})
    test::write_file(dir / f, "x");
  fs::create_directories(dir / "out.tmp.16/sub");
  test::write_file(dir / "out.tmp.16/sub/model.safetensors", "x");
  fs::create_directories(dir / "out/checkpoints/.tmp.step_00000003.17");
  test::write_file(dir / "out/metrics.jsonl", "x");
  test::write_file(dir / "out/checkpoints/latest.tmp.18", "x");
  fs::create_directories(dir / "out/model.tmp.19");
  test::write_file(dir / "out/model.tmp.19/config.json.tmp.19", "x");

  EXPECT_EQ(remove_stale_temporaries_of(dir / "p.bin"), 1);
  EXPECT_EQ(remove_stale_temporaries_of(dir / "p.idx"), 1);
  EXPECT_EQ(remove_stale_temporaries_of(dir / "out"), 2);
  EXPECT_EQ(dir.files(), (std::vector<std::string>{"out", "p.bin", "p.binx.tmp.13", "p.tmp.txt",
                                                   "q.bin.tmp.14"}));
  EXPECT_TRUE(fs::exists(dir / "out/model.tmp.19"));  // inside: only with `within`
  EXPECT_EQ(remove_stale_temporaries_of(dir / "out", true), 2);
  EXPECT_TRUE(fs::exists(dir / "out/metrics.jsonl"));
  EXPECT_TRUE(fs::exists(dir / "out/checkpoints/.tmp.step_00000003.17"));  // the checkpoint's own
  EXPECT_FALSE(fs::exists(dir / "out/checkpoints/latest.tmp.18"));
  EXPECT_FALSE(fs::exists(dir / "out/model.tmp.19"));
  EXPECT_EQ(remove_stale_temporaries_of(dir / "none"), 0);
}

TEST(AtomicFile, InstallFolderReplacesWhole) {
  test::TempDir dir("nk_install");
  namespace fs = std::filesystem;
  fs::create_directories(dir / "new1");
  test::write_file(dir / "new1/a", "1");
  install_folder(dir / "new1", dir / "model");
  fs::create_directories(dir / "new2");
  test::write_file(dir / "new2/b", "2");
  install_folder(dir / "new2", dir / "model");
  EXPECT_EQ(dir.files(), std::vector<std::string>{"model"});
  EXPECT_FALSE(fs::exists(dir / "model/a"));
  EXPECT_EQ(test::read_file(dir / "model/b"), "2");
}

}  // namespace
}  // namespace nk
