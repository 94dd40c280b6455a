// TensorBoard event files: the Trainer's scalars read back by an independent
// reader (tests/train/tfevents_check.py: the TFRecord framing and CRC-32C from
// the specification, the Event protobuf through Python's protobuf and protoc)
// equal metrics.jsonl's, one file per run, the step axis continuing once
// across a resume, also from a checkpoint older than the last logged step.
#include <gtest/gtest.h>

#include <filesystem>
#include <stdexcept>

#include "core/crc32c.h"
#include "data/dataset/gpt_test_data.h"
#include "test_paths.h"
#include "test_util.h"
#include "train/tensorboard.h"
#include "train/trainer.h"

namespace nk {
namespace {

using test::contains;
using test::TempDir;
namespace fs = std::filesystem;

// A tiny model on random tokens (DIR/ds, written once).
TrainConfig tiny(const TempDir& dir, const std::vector<std::string>& extra) {
  if (!fs::exists(dir / "ds.bin")) test::write_random_dataset(dir / "ds", 300, 60, 300, 1);
  std::vector<std::string> ov = {"data.prefix=" + (dir / "ds"),
                                 "model.preset=gpt-tiny",
                                 "model.n_layer=1",
                                 "model.d_model=32",
                                 "model.n_head=2",
                                 "model.d_ff=64",
                                 "model.vocab_size=300",
                                 "train.micro_batch=2",
                                 "train.seq_len=16",
                                 "train.global_batch=4",
                                 "train.steps=6",
                                 "train.lr=3e-3",
                                 "train.warmup_steps=1",
                                 "train.val_every=3",
                                 "train.val_batches=1",
                                 "train.log_every=100",
                                 "train.peak_tflops=1",
                                 "train.dtype=f32"};
  ov.insert(ov.end(), extra.begin(), extra.end());
  return train_config_from(Config::load(train_schema(), "", ov));
}

std::vector<std::string> event_files(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      out.push_back(e.path().string());
  return out;
}

// The independent reader's verdict on DIR's one event file against its metrics.jsonl.
void expect_matches_metrics(const fs::path& dir) {
  const std::vector<std::string> files = event_files(dir);
  ASSERT_EQ(files.size(), 1u) << "one event file per run in " << dir;
  EXPECT_TRUE(contains(fs::path(files[0]).filename().string(), "events.out.tfevents."));
  NK_REQUIRE_ASSET(test::run_command("protoc --version && /usr/bin/python3 -c 'import "
                                     "google.protobuf'")
                           .code == 0,
                   "protoc or Python's protobuf (protobuf-compiler, python3-protobuf)");
  const test::RunResult r = test::run_command("/usr/bin/python3 " + std::string(NK_SOURCE_DIR) +
                                              "/tests/train/tfevents_check.py " + files[0] + " " +
                                              (dir / "metrics.jsonl").string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "steps [1, 2, 3, 4, 5, 6]")) << r.out;
}

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the standard check value
  EXPECT_EQ(crc32c("", 0), 0u);
  // Continuing a CRC equals one pass.
  EXPECT_EQ(crc32c("6789", 4, crc32c("12345", 5)), 0xE3069283u);
}

TEST(TensorBoard, ScalarsEqualMetricsJsonl) {
  TempDir dir("nk_tb");
  TrainConfig cfg = tiny(dir, {"train.out_dir=" + (dir / "run")});
  EXPECT_TRUE(cfg.tensorboard);  // on by default
  Trainer(cfg).run();
  expect_matches_metrics(dir / "run");
}

TEST(TensorBoard, ResumeAppendsToTheSameFile) {
  TempDir dir("nk_tb");
  Trainer(tiny(dir, {"train.out_dir=" + (dir / "run"), "train.exit_at_step=3"})).run();
  const std::vector<std::string> first = event_files(dir / "run");
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(event_file_steps(first[0]), (std::vector<int64_t>{0, 1, 2, 3}));
  Trainer(tiny(dir, {"train.out_dir=" + (dir / "run")})).run();
  EXPECT_EQ(event_files(dir / "run"), first);
  expect_matches_metrics(dir / "run");
}

TEST(TensorBoard, ResumeFromAnOlderCheckpointDropsTheStepsRedone) {
  TempDir dir("nk_tb");
  // A run killed after logging step 5, its newest checkpoint step 4.
  Trainer killed(tiny(dir, {"train.out_dir=" + (dir / "run"), "train.save_every=2"}));
  EXPECT_THROW(killed.run([](const StepStats& s) {
    if (s.step == 5) throw std::runtime_error("killed");
  }),
               std::runtime_error);
  ASSERT_EQ(event_files(dir / "run").size(), 1u);
  EXPECT_EQ(event_file_steps(event_files(dir / "run")[0]).back(), 5);
  Trainer(tiny(dir, {"train.out_dir=" + (dir / "run")})).run();
  expect_matches_metrics(dir / "run");
}

TEST(TensorBoard, ATornTailIsDroppedOnResume) {
  TempDir dir("nk_tb");
  {
    EventFileWriter w(dir.path().string(), 0);
    for (int64_t s = 1; s <= 3; ++s) w.add_scalars(s, {{"loss", 1.0 / double(s)}});
  }
  const std::string path = event_files(dir.path())[0];
  const std::string whole = test::read_file(path);
  // A kill mid-write: half of a fourth record.
  const std::string fourth = tfrecord(encode_scalar_event(0, 4, {{"loss", 0.25}}));
  test::write_file(path, whole + fourth.substr(0, fourth.size() / 2));
  size_t valid = 0;
  EXPECT_EQ(event_file_steps(path, &valid), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(valid, whole.size());
  // A flipped byte fails the data CRC: reading stops before that record.
  std::string bad = whole;
  bad[bad.size() - 6] ^= 1;
  test::write_file(path, bad);
  EXPECT_EQ(event_file_steps(path), (std::vector<int64_t>{0, 1, 2}));
  {
    EventFileWriter w(dir.path().string(), 3);  // resumed at step 3: 3 was corrupt, so redone
    EXPECT_EQ(w.path(), path);
    w.add_scalars(3, {{"loss", 0.5}});
    w.add_scalars(4, {{"loss", 0.25}});
  }
  EXPECT_EQ(event_file_steps(path), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(TensorBoard, OffWritesNone) {
  TempDir dir("nk_tb");
  Trainer(tiny(dir, {"train.out_dir=" + (dir / "run"), "train.tensorboard=false"})).run();
  EXPECT_TRUE(fs::exists(dir / "run/metrics.jsonl"));
  EXPECT_TRUE(event_files(dir / "run").empty());
}

TEST(TensorBoard, AFreshRunReplacesThePreviousFile) {
  TempDir dir("nk_tb");
  Trainer(tiny(dir, {"train.out_dir=" + (dir / "a"), "train.steps=2"})).run();
  // A new run (no checkpoints to resume) in a folder holding an old event file.
  fs::create_directories(dir / "b");
  fs::copy(event_files(dir / "a")[0], dir / "b/events.out.tfevents.1000000000.oldhost");
  Trainer(tiny(dir, {"train.out_dir=" + (dir / "b")})).run();
  expect_matches_metrics(dir / "b");
}

TEST(TensorBoard, AFolderTheRunDoesNotOwnKeepsOtherFiles) {
  TempDir dir("nk_tb");
  // metrics files of several runs in one shared folder: each run its own event file.
  fs::create_directories(dir / "shared");
  const std::string other = dir / "shared/events.out.tfevents.1000000000.other";
  test::write_file(other, "another run's events");
  Trainer(tiny(dir, {"train.out_dir=" + (dir / "run"), "train.steps=2",
                     "train.metrics_file=" + (dir / "shared/run.jsonl")}))
      .run();
  EXPECT_EQ(test::read_file(other), "another run's events");
  EXPECT_EQ(event_files(dir / "shared").size(), 2u);
  EXPECT_TRUE(event_files(dir / "run").empty());
}

}  // namespace
}  // namespace nk
