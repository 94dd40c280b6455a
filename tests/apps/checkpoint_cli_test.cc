// `nekton train` killed at random moments (kill -9, often in the middle of a
// checkpoint save) or stopped with SIGTERM, then simply rerun: it resumes from
// the last complete checkpoint and ends with the same per-step losses and the
// same final weights, byte for byte, as a run that was never interrupted.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <sstream>
#include <thread>

#include "test_util.h"

namespace nk {
namespace {

namespace fs = std::filesystem;
using test::contains;
using test::TempDir;
using Clock = std::chrono::steady_clock;

const int kSteps = 20;  // a save per step makes each run ~2 s

std::vector<std::string> train_args(const std::string& corpus, const std::string& out) {
  return {"train",
          "model.preset=gpt-tiny",
          "model.n_layer=2",
          "model.d_model=64",
          "model.n_head=2",
          "model.d_ff=128",
          "train.micro_batch=2",
          "train.seq_len=16",
          "train.global_batch=4",
          "train.steps=" + std::to_string(kSteps),
          "train.warmup_steps=4",
          "train.lr=3e-3",
          "train.val_every=0",
          "train.peak_tflops=1",
          "train.dtype=bf16",
          "train.save_every=1",
          "data.path=" + corpus,
          "train.out_dir=" + out};
}

std::string joined(const std::vector<std::string>& args) {
  std::string s;
  for (const auto& a : args) s += a + " ";
  return s;
}

size_t count_lines(const std::string& path) {
  std::string s = test::read_file(path);
  return size_t(std::count(s.begin(), s.end(), '\n'));
}

// Names in OUT/checkpoints that are not step folders or `latest`.
std::vector<std::string> leftovers(const fs::path& root) {
  std::vector<std::string> odd;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::string n = e.path().filename();
    if (n != "latest" && n.rfind("step_", 0) != 0) odd.push_back(n);
  }
  return odd;
}

struct Reference {
  std::vector<double> losses;
  std::string weights;
  double seconds = 0;
};

Reference reference_run(const TempDir& dir) {
  Reference ref;
  auto t0 = Clock::now();
  auto r = test::run_nekton(joined(train_args(dir / "c.txt", dir / "ref")));
  ref.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(r.code, 0) << r.out;
  ref.losses = test::logged_losses(dir / "ref/metrics.jsonl");
  EXPECT_EQ(ref.losses.size(), size_t(kSteps));
  ref.weights = test::read_file(dir / "ref/model/model.safetensors");
  return ref;
}

void write_corpus(const TempDir& dir) {
  std::string text;
  for (int i = 0; i < 400; ++i) text += "Sentence " + std::to_string(i * 31 % 97) + " is here. ";
  test::write_file(dir / "c.txt", text);
}

void expect_matches_reference(const Reference& ref, const std::string& out) {
  EXPECT_EQ(test::logged_losses(out + "/metrics.jsonl"), ref.losses);
  EXPECT_TRUE(test::read_file(out + "/model/model.safetensors") == ref.weights)
      << "final weights differ";
  EXPECT_EQ(test::read_file(out + "/checkpoints/latest"), "step_00000020\n");
  EXPECT_EQ(leftovers(out + "/checkpoints"), std::vector<std::string>{});
}

TEST(CheckpointCli, KillNineAtRandomMomentsThenRerun) {
  TempDir dir("nk_kill");
  write_corpus(dir);
  Reference ref = reference_run(dir);
  std::mt19937 rng(20240611);
  int mid_save = 0;
  for (int trial = 0; trial < 3; ++trial) {
    const std::string name = fmt::format("t{}", trial);
    SCOPED_TRACE(name);
    std::string out = dir / name;
    std::vector<std::string> args = train_args(dir / "c.txt", out);
    // Kill somewhere in the run (startup excluded, roughly), twice per trial.
    for (int kill = 0; kill < 2; ++kill) {
      std::uniform_real_distribution<double> when(0.15 * ref.seconds, 0.9 * ref.seconds);
      pid_t pid = test::spawn_nekton(args, out + ".log");
      ASSERT_GT(pid, 0);
      std::this_thread::sleep_for(std::chrono::duration<double>(when(rng)));
      ::kill(pid, SIGKILL);
      int st = 0;
      ::waitpid(pid, &st, 0);
      if (!leftovers(out + "/checkpoints").empty()) ++mid_save;
    }
    auto r = test::run_nekton(joined(args));
    ASSERT_EQ(r.code, 0) << r.out;
    expect_matches_reference(ref, out);
    EXPECT_EQ(test::leftover_files(out), std::vector<std::string>{});
  }
  // How many kills landed inside a save (a temporary folder left behind): for
  // the record, since timing decides it.
  RecordProperty("kills_during_save", mid_save);
  std::printf("kills that interrupted a checkpoint save: %d of 6\n", mid_save);
}

TEST(CheckpointCli, SigtermSavesExitsZeroAndResumes) {
  TempDir dir("nk_term");
  write_corpus(dir);
  Reference ref = reference_run(dir);
  std::string out = dir / "run";
  std::vector<std::string> args = train_args(dir / "c.txt", out);
  pid_t pid = test::spawn_nekton(args, dir / "run.log");
  ASSERT_GT(pid, 0);
  auto deadline = Clock::now() + std::chrono::seconds(60);
  while (count_lines(out + "/metrics.jsonl") < 6 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::kill(pid, SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ::kill(pid, SIGTERM);  // a second signal, likely while saving: changes nothing
  int st = 0;
  ::waitpid(pid, &st, 0);
  std::string log = test::read_file(dir / "run.log");
  ASSERT_TRUE(WIFEXITED(st)) << log;
  EXPECT_EQ(WEXITSTATUS(st), 0) << log;
  EXPECT_TRUE(contains(log, "SIGTERM received: stopped cleanly after step")) << log;
  size_t done = test::logged_losses(out + "/metrics.jsonl").size();
  EXPECT_GE(done, 6u);
  EXPECT_LT(done, size_t(kSteps)) << "the run finished before the signal";
  char name[32];
  std::snprintf(name, sizeof name, "step_%08zu\n", done);
  EXPECT_EQ(test::read_file(out + "/checkpoints/latest"), name);
  auto r = test::run_nekton(joined(args));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "resuming from checkpoint")) << r.out;
  expect_matches_reference(ref, out);
}

// A kill after the last step_N is installed but before `latest` is updated and
// the old folders removed leaves a finished run with a stale pointer and
// leftovers; rerunning it has nothing to train or save, and still repairs both.
TEST(CheckpointCli, RerunOfAFinishedRunRemovesLeftovers) {
  TempDir dir("nk_tidy");
  write_corpus(dir);
  Reference ref = reference_run(dir);
  const std::string root = dir / "ref/checkpoints";
  fs::create_directories(root + "/.trash.step_00000017.4242");
  test::write_file(root + "/.trash.step_00000017.4242/model.safetensors", "x");
  test::write_file(root + "/latest.tmp.4242", "step_0000");
  test::write_file(root + "/latest", "step_00000019\n");
  // A kill in the final model save or a metrics rewrite leaves these.
  fs::create_directories(dir / "ref/model.tmp.4242");
  test::write_file(dir / "ref/model.tmp.4242/model.safetensors", "x");
  fs::create_directories(dir / "ref/model.old.tmp.4243");
  test::write_file(dir / "ref/model/trainer_state.json.tmp.4244", "{");
  test::write_file(dir / "ref/metrics.jsonl.tmp.4245", "{");
  test::write_file(dir / "ref/.nekton.lock", "4246\n");  // of a killed run: no obstacle
  auto r = test::run_nekton(joined(train_args(dir / "c.txt", dir / "ref")));
  ASSERT_EQ(r.code, 0) << r.out;
  expect_matches_reference(ref, dir / "ref");
  EXPECT_EQ(test::leftover_files(dir / "ref"), std::vector<std::string>{});
}

// Two runs on one train.out_dir would delete each other's files and tear
// metrics.jsonl: the second fails at once, naming the first one's pid.
TEST(CheckpointCli, SecondRunOnABusyOutDirFailsNamingThePid) {
  TempDir dir("nk_busy");
  write_corpus(dir);
  // The first run holds OUT/.nekton.lock while it waits for its data to open.
  ASSERT_EQ(::mkfifo((dir / "fifo.txt").c_str(), 0644), 0);
  const std::string out = dir / "run";
  pid_t first = test::spawn_nekton(train_args(dir / "fifo.txt", out), dir / "first.log");
  ASSERT_GT(first, 0);
  std::string holder = test::wait_for_file(out + "/.nekton.lock");
  EXPECT_EQ(holder, std::to_string(first) + "\n") << test::read_file(dir / "first.log");
  auto t0 = Clock::now();
  auto r = test::run_nekton(joined(train_args(dir / "c.txt", out)));
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 30.0);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "error: '" + out + "' is in use by nekton pid " +
                                  std::to_string(first) + " (lock file '" + out +
                                  "/.nekton.lock')"))
      << r.out;
  EXPECT_FALSE(fs::exists(out + "/metrics.jsonl"));
  ::kill(first, SIGKILL);
  int st = 0;
  ::waitpid(first, &st, 0);
  // The lock file a killed run leaves blocks nothing.
  r = test::run_nekton(joined(train_args(dir / "c.txt", out)));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(test::logged_losses(out + "/metrics.jsonl").size(), size_t(kSteps));
  EXPECT_EQ(test::leftover_files(out), std::vector<std::string>{});
}

}  // namespace
}  // namespace nk
