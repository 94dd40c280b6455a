// Progress: the updating bar line on a terminal (a pseudo-terminal here), the
// plain log lines elsewhere, none in "none" mode; the counted line's text.
#include "core/progress.h"

#include <gtest/gtest.h>
#include <pty.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>

#include "test_util.h"

namespace nk {
namespace {

using test::contains;

// What `f(out)` wrote to a temporary FILE*.
template <class F>
std::string written(F&& f) {
  FILE* out = std::tmpfile();
  f(out);
  std::fflush(out);
  std::rewind(out);
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, out)) > 0) s.append(buf, n);
  std::fclose(out);
  return s;
}

TEST(Progress, BarUpdatesOneLineInPlace) {
  const std::string s = written([](FILE* out) {
    Progress p("export gguf", ProgressMode::Bar, 10, out);
    EXPECT_EQ(p.every_s(), 0.25);
    p.start(200e6, "B");
    p.advance(50e6);                              // the first update draws at once
    for (int i = 0; i < 3; ++i) p.advance(50e6);  // within 0.25 s: not drawn
    p.finish();
  });
  EXPECT_EQ(s.find('\n'), s.size() - 1) << s;  // one line, ended once
  EXPECT_TRUE(contains(s, "\rexport gguf [######..................]  25.0%  50.0/200.0 MB")) << s;
  EXPECT_TRUE(contains(s, "\x1b[K")) << s;
  EXPECT_FALSE(contains(s, " 50.0%")) << s;
  EXPECT_TRUE(contains(s, "\rexport gguf [########################] 100.0%  200.0/200.0 MB")) << s;
  EXPECT_TRUE(contains(s, "ETA done")) << s;
}

TEST(Progress, AnOpenBarLineIsEndedBeforeWhatFollows) {
  const std::string s = written([](FILE* out) {
    Progress p("curate", ProgressMode::Bar, 10, out);
    p.show("stage 1 of 3");
    p.end_line();
    std::fputs("error: x\n", out);
  });
  EXPECT_EQ(s, "\rcurate stage 1 of 3\x1b[K\nerror: x\n");
}

TEST(Progress, LogModeWritesPlainLinesAtItsInterval) {
  const std::string quick = written([](FILE* out) {
    Progress p("import hf", ProgressMode::Log, 10, out);
    p.start(3, "tensors");
    for (int i = 0; i < 3; ++i) p.advance(1);
    p.finish();
  });
  EXPECT_EQ(quick, "");  // work shorter than the interval prints nothing
  const std::string slow = written([](FILE* out) {
    Progress p("import hf", ProgressMode::Log, 0.01, out);
    p.start(3, "tensors");
    for (int i = 0; i < 3; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      p.advance(1);
    }
    p.finish();
  });
  EXPECT_TRUE(contains(slow, "[info] import hf [")) << slow;
  EXPECT_TRUE(contains(slow, "3/3 tensors")) << slow;
  EXPECT_EQ(slow.find('\r'), std::string::npos) << slow;
  const std::string shown = written([](FILE* out) {
    Progress p("curate", ProgressMode::Log, 10, out);
    p.show("dedup 10%");
    p.show("dedup 20%");  // within the interval
    p.show("dedup done", true);
  });
  EXPECT_EQ(shown, "[info] curate dedup 10%\n[info] curate dedup done\n");
}

TEST(Progress, NoneWritesNothing) {
  EXPECT_EQ(written([](FILE* out) {
              Progress p("x", ProgressMode::None, 0, out);
              p.start(1, "B");
              p.advance(1);
              p.show("y", true);
              p.finish();
            }),
            "");
}

TEST(Progress, AutoIsABarOnATerminalOnly) {
  int master = -1, slave = -1;
  ASSERT_EQ(::openpty(&master, &slave, nullptr, nullptr, nullptr), 0);
  FILE* tty = ::fdopen(slave, "w");
  EXPECT_EQ(Progress("x", ProgressMode::Auto, 10, tty).mode(), ProgressMode::Bar);
  std::fclose(tty);
  ::close(master);
  FILE* file = std::tmpfile();
  EXPECT_EQ(Progress("x", ProgressMode::Auto, 10, file).mode(), ProgressMode::Log);
  std::fclose(file);
}

TEST(Progress, ModesAndEta) {
  EXPECT_EQ(parse_progress_mode("bar", "k"), ProgressMode::Bar);
  EXPECT_EQ(test::error_of([] { parse_progress_mode("fancy", "preprocess.progress"); }),
            "preprocess.progress: expected auto, bar, log or none, got 'fancy'");
  EXPECT_EQ(format_eta(75), "1:15");
  EXPECT_EQ(format_eta(3 * 3600 + 61), "3:01:01");
  EXPECT_EQ(progress_bar(0.5, 4), "[##..]");
}

}  // namespace
}  // namespace nk
