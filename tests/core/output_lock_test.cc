#include "core/output_lock.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "test_util.h"

namespace nk {
namespace {

namespace fs = std::filesystem;
using test::contains;

TEST(OutputLock, SecondHolderFailsNamingThePidAndTheLockFile) {
  test::TempDir dir("nk_lock");
  const std::string out = dir / "run";
  {
    OutputLock a(out, LockAt::Inside);
    EXPECT_EQ(a.file(), out + "/.nekton.lock");
    EXPECT_TRUE(fs::is_directory(out));
    std::string msg = test::error_of([&] { OutputLock b(out + "/", LockAt::Inside); });
    EXPECT_TRUE(
        contains(msg, "'" + out + "/' is in use by nekton pid " + std::to_string(::getpid())))
        << msg;
    EXPECT_TRUE(contains(msg, out + "/.nekton.lock")) << msg;
    // Another output beside it is not held.
    OutputLock c(out, LockAt::Beside);
    EXPECT_EQ(c.file(), out + ".lock");
  }
  // Released and removed: nothing is left, and the next run gets it.
  EXPECT_FALSE(fs::exists(out + "/.nekton.lock"));
  EXPECT_FALSE(fs::exists(out + ".lock"));
  OutputLock again(out, LockAt::Inside);
}

// A holder killed with SIGKILL leaves its lock file, which blocks nothing.
TEST(OutputLock, HeldByAnotherProcessThenFreedByItsDeath) {
  test::TempDir dir("nk_lock");
  const std::string out = dir / "data/prefix";
  fs::create_directories(dir / "data");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  if (child == 0) {
    ::close(ready[0]);
    try {
      OutputLock l(out, LockAt::Beside);
      char c = 1;
      if (::write(ready[1], &c, 1) != 1) ::_exit(3);
      ::pause();
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(0);
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  std::string msg = test::error_of([&] { OutputLock l(out, LockAt::Beside); });
  EXPECT_TRUE(contains(
      msg, "in use by nekton pid " + std::to_string(child) + " (lock file '" + out + ".lock')"))
      << msg;
  ::kill(child, SIGKILL);
  int st = 0;
  ::waitpid(child, &st, 0);
  EXPECT_TRUE(fs::exists(out + ".lock"));  // stale, yet no obstacle
  OutputLock l(out, LockAt::Beside);
  EXPECT_EQ(test::read_file(out + ".lock"), std::to_string(::getpid()) + "\n");
}

}  // namespace
}  // namespace nk
