// Exact resume: a run stopped at step k and continued from its checkpoint
// produces the very same losses, gradient norms and final weights, bit for
// bit, as an uninterrupted run (f32 and bf16, gradient accumulation, warmup
// and cosine decay across the cut, text and indexed data), whether it stopped
// at exit_at_step, on SIGTERM, or is restarted from an older checkpoint.
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "ckpt/checkpoint.h"
#include "data/dataset/gpt_test_data.h"
#include "ops/ops.h"
#include "test_util.h"
#include "train/trainer.h"

namespace nk {
namespace {

using test::contains;
using test::error_of;
using test::TempDir;
namespace fs = std::filesystem;

const int64_t kSteps = 60, kCut = 23;

TrainConfig tiny(const std::vector<std::string>& extra) {
  std::vector<std::string> ov = {
      "model.preset=gpt-tiny", "model.n_layer=2",    "model.d_model=64",
      "model.n_head=2",        "model.d_ff=128",     "model.vocab_size=300",
      "train.micro_batch=2",   "train.seq_len=16",   "train.global_batch=4",
      "train.steps=60",        "train.lr=3e-3",      "train.min_lr=3e-4",
      "train.warmup_steps=10", "train.val_every=20", "train.val_batches=1",
      "train.log_every=1000",  "train.peak_tflops=1"};
  ov.insert(ov.end(), extra.begin(), extra.end());
  return train_config_from(Config::load(train_schema(), "", ov));
}

std::vector<std::string> with(std::vector<std::string> keys, const std::vector<std::string>& more) {
  keys.insert(keys.end(), more.begin(), more.end());
  return keys;
}

struct RunResult {
  std::vector<StepStats> history;
  Tensor params;  // f32 master weights at the end
};

RunResult run(const std::vector<std::string>& keys,
              const std::function<void(const StepStats&)>& f = {}) {
  Trainer t(tiny(keys));
  t.run(f);
  RunResult r;
  r.history = t.history();
  r.params = Tensor::empty(t.model().params().shape(), DType::F32);
  std::memcpy(r.params.raw(), t.model().params().raw(), r.params.nbytes());
  return r;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// `tail` continues `head` exactly where `straight` went on.
void expect_continues(const RunResult& straight, const std::vector<StepStats>& head,
                      const RunResult& tail) {
  std::vector<StepStats> joined = head;
  joined.insert(joined.end(), tail.history.begin(), tail.history.end());
  ASSERT_EQ(joined.size(), straight.history.size());
  for (size_t i = 0; i < joined.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i + 1));
    EXPECT_EQ(joined[i].step, straight.history[i].step);
    // Bit for bit: EXPECT_EQ on doubles compares exactly.
    EXPECT_EQ(joined[i].loss, straight.history[i].loss);
    EXPECT_EQ(joined[i].grad_norm, straight.history[i].grad_norm);
    EXPECT_EQ(joined[i].lr, straight.history[i].lr);
    if (!std::isnan(straight.history[i].val_loss)) {
      EXPECT_EQ(joined[i].val_loss, straight.history[i].val_loss);
    }
  }
  EXPECT_TRUE(same_bytes(tail.params, straight.params));
}

void expect_exact_resume(const std::vector<std::string>& data, const TempDir& dir) {
  RunResult straight = run(with(data, {"train.out_dir=" + (dir / "straight")}));
  ASSERT_EQ(straight.history.size(), size_t(kSteps));
  // Warmup and decay both matter across the cut.
  ASSERT_LT(straight.history[kCut - 1].lr, straight.history[9].lr);

  std::vector<std::string> split = with(data, {"train.out_dir=" + (dir / "split")});
  RunResult head = run(with(split, {"train.exit_at_step=" + std::to_string(kCut)}));
  ASSERT_EQ(head.history.size(), size_t(kCut));
  ASSERT_TRUE(fs::exists(dir / "split/checkpoints/step_00000023/manifest.json"));
  RunResult tail = run(split);  // train.resume=auto finds the checkpoint
  EXPECT_EQ(tail.history.front().step, kCut + 1);
  expect_continues(straight, head.history, tail);
  // The metrics file holds every step once, with the straight run's losses.
  EXPECT_EQ(test::logged_losses(dir / "split/metrics.jsonl"),
            test::logged_losses(dir / "straight/metrics.jsonl"));
}

class ExactResume : public ::testing::TestWithParam<const char*> {};

TEST_P(ExactResume, TextCorpus) {
  TempDir dir("nk_exact");
  std::string text;
  for (int i = 0; i < 300; ++i) text += "Line " + std::to_string(i * 7919 % 1000) + " of text.\n";
  test::write_file(dir / "c.txt", text);
  expect_exact_resume({"data.path=" + (dir / "c.txt"), std::string("train.dtype=") + GetParam()},
                      dir);
}

TEST_P(ExactResume, IndexedDataset) {
  TempDir dir("nk_exact");
  std::string prefix = test::write_random_dataset(dir / "ds", 400, 60, 300, 1);
  expect_exact_resume(
      {"data.prefix=" + prefix, "data.split=90,10,0", std::string("train.dtype=") + GetParam()},
      dir);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ExactResume, ::testing::Values("f32", "bf16"));

// The issue's own check at its length: 2000 steps straight against 1234 steps,
// stop, resume to 2000 (bf16, indexed data); every step's loss bit for bit.
TEST(ExactResume, TwoThousandSteps) {
  TempDir dir("nk_exact2k");
  std::string prefix = test::write_random_dataset(dir / "ds", 400, 60, 300, 1);
  std::vector<std::string> data = {"data.prefix=" + prefix,  "data.split=90,10,0",
                                   "train.dtype=bf16",       "train.steps=2000",
                                   "train.warmup_steps=100", "train.val_every=500"};
  RunResult straight = run(with(data, {"train.out_dir=" + (dir / "straight")}));
  ASSERT_EQ(straight.history.size(), 2000u);
  std::vector<std::string> split = with(data, {"train.out_dir=" + (dir / "split")});
  RunResult head = run(with(split, {"train.exit_at_step=1234"}));
  RunResult tail = run(split);
  EXPECT_EQ(tail.history.front().step, 1235);
  expect_continues(straight, head.history, tail);
}

TEST(ExactResume, SigtermSavesAtTheEndOfTheStep) {
  TempDir dir("nk_exact");
  std::string prefix = test::write_random_dataset(dir / "ds", 400, 60, 300, 1);
  std::vector<std::string> data = {"data.prefix=" + prefix, "train.dtype=bf16"};
  RunResult straight = run(with(data, {"train.out_dir=" + (dir / "straight")}));

  std::vector<std::string> keys = with(data, {"train.out_dir=" + (dir / "sig")});
  RunResult head;
  {
    Trainer t(tiny(keys));
    testing::internal::CaptureStderr();
    t.run([](const StepStats& s) {
      if (s.step == kCut) std::raise(SIGTERM);  // as if `kill -TERM` arrived mid-step
    });
    std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(t.stopped(), SIGTERM);
    EXPECT_EQ(t.state().step, kCut);
    EXPECT_TRUE(contains(err, "SIGTERM received: stopped cleanly after step 23")) << err;
    head.history = t.history();
  }
  EXPECT_EQ(read_latest_pointer(dir / "sig/checkpoints"), "step_00000023");
  EXPECT_FALSE(fs::exists(dir / "sig/model"));  // the export waits for the end of the run
  RunResult tail = run(keys);
  expect_continues(straight, head.history, tail);
  EXPECT_TRUE(fs::exists(dir / "sig/model/model.safetensors"));
}

// train.save_final=false (autoconfig's and estimate's timing runs): the
// metrics only, no checkpoint and no model after the last step; a stop at
// train.exit_at_step still saves, and the run resumes from it.
TEST(ExactResume, SaveFinalFalseWritesOnlyTheMetrics) {
  TempDir dir("nk_exact");
  std::string prefix = test::write_random_dataset(dir / "ds", 400, 60, 300, 1);
  std::vector<std::string> data = {"data.prefix=" + prefix, "train.dtype=f32", "train.steps=4",
                                   "train.save_final=false"};
  RunResult whole = run(with(data, {"train.out_dir=" + (dir / "a")}));
  EXPECT_EQ(whole.history.size(), 4u);
  EXPECT_TRUE(fs::exists(dir / "a/metrics.jsonl"));
  EXPECT_FALSE(fs::exists(dir / "a/checkpoints"));
  EXPECT_FALSE(fs::exists(dir / "a/model"));

  RunResult head = run(with(data, {"train.out_dir=" + (dir / "b"), "train.exit_at_step=2"}));
  EXPECT_EQ(read_latest_pointer(dir / "b/checkpoints"), "step_00000002");
  EXPECT_TRUE(fs::exists(dir / "b/model/model.safetensors"));
  RunResult tail = run(with(data, {"train.out_dir=" + (dir / "b")}));
  expect_continues(whole, head.history, tail);
  EXPECT_EQ(read_latest_pointer(dir / "b/checkpoints"), "step_00000002");  // none at step 4
}

TEST(ExactResume, FromAnOlderCheckpointFolder) {
  TempDir dir("nk_exact");
  std::string prefix = test::write_random_dataset(dir / "ds", 400, 60, 300, 1);
  std::vector<std::string> data = {"data.prefix=" + prefix, "train.dtype=f32"};
  RunResult straight = run(with(
      data, {"train.out_dir=" + (dir / "a"), "train.save_every=10", "train.keep_checkpoints=2"}));
  std::vector<std::string> names;
  for (const auto& d : list_checkpoints(dir / "a/checkpoints"))
    names.push_back(fs::path(d).filename());
  EXPECT_EQ(names, (std::vector<std::string>{"step_00000060", "step_00000050"}));
  EXPECT_EQ(read_latest_pointer(dir / "a/checkpoints"), "step_00000060");

  // An explicit checkpoint folder, into a fresh OUT_DIR.
  RunResult tail = run(with(data, {"train.out_dir=" + (dir / "b"),
                                   "train.resume_from=" + (dir / "a/checkpoints/step_00000050")}));
  std::vector<StepStats> head(straight.history.begin(), straight.history.begin() + 50);
  expect_continues(straight, head, tail);

  // A finished run rerun: nothing to do, the same weights.
  RunResult again = run(with(data, {"train.out_dir=" + (dir / "a")}));
  EXPECT_TRUE(again.history.empty());
  EXPECT_TRUE(same_bytes(again.params, straight.params));
}

TEST(ExactResume, ResumeSettingsAreChecked) {
  TempDir dir("nk_exact");
  std::string prefix = test::write_random_dataset(dir / "ds", 400, 60, 300, 1);
  std::vector<std::string> data = {"data.prefix=" + prefix, "train.dtype=f32", "train.steps=4"};
  run(with(data, {"train.out_dir=" + (dir / "a"), "train.exit_at_step=2"}));
  std::string msg = error_of([&] {
    Trainer t(tiny(with(data, {"train.out_dir=" + (dir / "a"), "train.resume=never"})));
  });
  EXPECT_TRUE(contains(msg, "train.resume=never: train.out_dir already holds checkpoints in '" +
                                (dir / "a/checkpoints") + "'"))
      << msg;
  msg = error_of([&] { tiny({"data.prefix=" + prefix, "train.resume=sometimes"}); });
  EXPECT_TRUE(contains(msg, "train.resume: expected auto or never, got 'sometimes'")) << msg;
  // Another model shape in the same OUT_DIR: the tensor and both shapes.
  msg = error_of([&] {
    Trainer t(tiny(with(data, {"train.out_dir=" + (dir / "a"), "model.d_model=32"})));
  });
  EXPECT_TRUE(contains(msg,
                       "model.safetensors: tensor 'wte' has shape [300, 64] in the "
                       "checkpoint, but this model's is [300, 32]"))
      << msg;
  // Same shapes, another norm_eps.
  msg = error_of([&] {
    Trainer t(tiny(with(data, {"train.out_dir=" + (dir / "a"), "model.norm_eps=0.001"})));
  });
  EXPECT_TRUE(contains(msg, "model norm_eps is")) << msg;
  // A key written only when set (a sliding window), dropped on resume.
  run(with(data,
           {"train.out_dir=" + (dir / "w"), "train.exit_at_step=2", "model.sliding_window=8"}));
  msg = error_of([&] { Trainer t(tiny(with(data, {"train.out_dir=" + (dir / "w")}))); });
  EXPECT_TRUE(contains(msg, "model sliding_window is 8")) << msg;
  EXPECT_TRUE(contains(msg, "but not set here")) << msg;
  // Resuming another run into an OUT_DIR that has checkpoints would mix them.
  run(with(data, {"train.out_dir=" + (dir / "b"), "train.exit_at_step=1"}));
  msg = error_of([&] {
    Trainer t(
        tiny(with(data, {"train.out_dir=" + (dir / "b"), "train.resume_from=" + (dir / "a")})));
  });
  EXPECT_TRUE(contains(msg, "would mix two runs")) << msg;
}

// A sharded save (ZeRO-1: each rank writes optimizer.RRRRR-of-NNNNN with 1-D
// pieces of the moments) is read back into whole moments, whatever cut the
// pieces. Made here from a one-process checkpoint, cut into three files at
// arbitrary element boundaries (through parameters); bad cuts are refused.
class ShardedCheckpoint : public ::testing::Test {
 protected:
  // Rewrites checkpoint `src` as ROOT/step_N with its moments in three files;
  // `cut` may change each file's list of (tensor, begin, end) first, and
  // `edit` the weights and text files.
  using Pieces = std::vector<std::vector<std::tuple<std::string, int64_t, int64_t>>>;
  std::string reshard(const std::string& src, const std::string& root,
                      const std::function<void(Pieces&)>& cut = {},
                      const std::function<void(CheckpointContents&)>& edit = {}) {
    CheckpointReader r = CheckpointReader::open(src);
    SafetensorsFile model = r.model(), opt = r.optimizer();
    CheckpointContents c;
    c.step = r.step();
    for (const SafetensorsEntry& e : model.entries())
      c.model.emplace_back(e.name, model.get(e.name));
    for (const char* f : {"trainer_state.json", "config.yaml", "config.json"})
      c.text_files[f] = r.text(f);
    Pieces pieces(3);
    int64_t total = 0;
    for (const SafetensorsEntry& e : opt.entries()) total += shape_numel(e.shape);
    int64_t at = 0;  // running element index over all moments: file k holds its third
    for (const SafetensorsEntry& e : opt.entries()) {
      const int64_t n = shape_numel(e.shape);
      for (int64_t k = 0; k < 3; ++k) {
        const int64_t lo = std::max(at, k * total / 3), hi = std::min(at + n, (k + 1) * total / 3);
        if (hi > lo) pieces[size_t(k)].emplace_back(e.name, lo - at, hi - at);
      }
      at += n;
    }
    if (cut) cut(pieces);
    if (edit) edit(c);
    const std::string tmp = shared_checkpoint_tmp(root, c.step, 1);
    prepare_shared_checkpoint(root, tmp);
    std::vector<std::string> records;
    for (size_t k = 0; k < 3; ++k) {
      CheckpointShard sh;
      sh.file = checkpoint_shard_file("optimizer", int64_t(k), 3);
      sh.metadata = opt.metadata();
      for (auto& [name, lo, hi] : pieces[k]) {
        Tensor whole = opt.get(name);
        sh.tensors.emplace_back(name, whole.view({whole.numel()}).narrow0(lo, hi - lo));
        sh.pieces[name] = {whole.shape(), lo, hi};
      }
      records.push_back(write_checkpoint_shard(tmp, sh));
    }
    return finish_shared_checkpoint(root, tmp, c, records, 2);
  }
};

TEST_F(ShardedCheckpoint, PiecesFromAnyCutAreReassembled) {
  TempDir dir("nk_sharded");
  std::string prefix = test::write_random_dataset(dir / "ds", 400, 60, 300, 1);
  std::vector<std::string> keys = {"data.prefix=" + prefix, "train.dtype=f32", "train.steps=4"};
  run(with(keys, {"train.out_dir=" + (dir / "a"), "train.exit_at_step=2"}));
  const TrainConfig cfg = tiny(with(keys, {"train.out_dir=" + (dir / "b")}));
  const std::string src = dir / "a/checkpoints/step_00000002";
  const std::string sharded = reshard(src, dir / "b/checkpoints");
  EXPECT_EQ(CheckpointReader::open(sharded).world_size(), 3);
  EXPECT_FALSE(fs::exists(fs::path(sharded) / "optimizer.safetensors"));
  LoadedTrainCheckpoint whole = load_train_checkpoint(src, cfg);
  LoadedTrainCheckpoint pieces = load_train_checkpoint(sharded, cfg);
  EXPECT_TRUE(same_bytes(whole.exp_avg, pieces.exp_avg));
  EXPECT_TRUE(same_bytes(whole.exp_avg_sq, pieces.exp_avg_sq));
  EXPECT_TRUE(same_bytes(whole.model->params(), pieces.model->params()));
  // And a run resumes from it exactly as from the original.
  RunResult straight = run(with(keys, {"train.out_dir=" + (dir / "c")}));
  RunResult tail = run(with(keys, {"train.out_dir=" + (dir / "b")}));
  ASSERT_EQ(tail.history.size(), 2u);
  EXPECT_EQ(tail.history[1].loss, straight.history[3].loss);
  EXPECT_TRUE(same_bytes(tail.params, straight.params));
}

// A checkpoint holding NaN or Inf weights (written by hand: the trainer never
// saves one) is refused on resume, naming the tensor and the count, before
// a run would take it into a non-finite loss.
TEST_F(ShardedCheckpoint, NonFiniteWeightsAreRefused) {
  TempDir dir("nk_ckpt_nan");
  std::string prefix = test::write_random_dataset(dir / "ds", 400, 60, 300, 1);
  std::vector<std::string> keys = {"data.prefix=" + prefix, "train.dtype=f32", "train.steps=4"};
  run(with(keys, {"train.out_dir=" + (dir / "a"), "train.exit_at_step=2"}));
  const TrainConfig cfg = tiny(with(keys, {"train.out_dir=" + (dir / "x")}));
  const std::string bad =
      reshard(dir / "a/checkpoints/step_00000002", dir / "nan", {}, [](CheckpointContents& c) {
        for (auto& [name, t] : c.model)
          if (name == "ln_f.weight") {
            Tensor copy = Tensor::empty(t.shape(), DType::F32);
            ops::convert(copy, t);
            copy.data<float>()[1] = NAN;
            copy.data<float>()[2] = -INFINITY;
            t = copy;
          }
      });
  std::string msg = error_of([&] { load_train_checkpoint(bad, cfg); });
  EXPECT_TRUE(contains(msg, "tensor 'ln_f.weight' has 2 non-finite values")) << msg;
}

TEST_F(ShardedCheckpoint, MissingOrDoubledPiecesAreRefused) {
  TempDir dir("nk_sharded_bad");
  std::string prefix = test::write_random_dataset(dir / "ds", 400, 60, 300, 1);
  std::vector<std::string> keys = {"data.prefix=" + prefix, "train.dtype=f32", "train.steps=4"};
  run(with(keys, {"train.out_dir=" + (dir / "a"), "train.exit_at_step=2"}));
  const std::string src = dir / "a/checkpoints/step_00000002";
  const TrainConfig cfg = tiny(with(keys, {"train.out_dir=" + (dir / "x")}));
  std::string lost;
  std::string dir_missing = reshard(src, dir / "missing", [&](Pieces& p) {
    lost = std::get<0>(p[1].back());
    p[1].pop_back();
  });
  std::string msg = error_of([&] { load_train_checkpoint(dir_missing, cfg); });
  EXPECT_TRUE(contains(msg, "the shards miss elements")) << msg;
  EXPECT_TRUE(contains(msg, "'" + lost + "'")) << msg;
  std::string dir_twice = reshard(src, dir / "twice", [](Pieces& p) { p[2].push_back(p[0][0]); });
  msg = error_of([&] { load_train_checkpoint(dir_twice, cfg); });
  EXPECT_TRUE(contains(msg, "the shards hold twice elements")) << msg;
  // A shard file that does not verify: the checkpoint is refused by name.
  {
    std::ofstream f(fs::path(dir_twice) / "optimizer.00001-of-00003.safetensors",
                    std::ios::binary | std::ios::app);
    f << "x";
  }
  msg = error_of([&] { load_train_checkpoint(dir_twice, cfg); });
  EXPECT_TRUE(contains(msg, "optimizer.00001-of-00003.safetensors is")) << msg;
  EXPECT_TRUE(contains(msg, "truncated?")) << msg;
}

}  // namespace
}  // namespace nk
