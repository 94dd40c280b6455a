// Training from indexed datasets: stop at step k and resume reads exactly the
// samples an uninterrupted run reads; bad data settings are named.
#include <gtest/gtest.h>

#include <filesystem>

#include "ckpt/model_io.h"
#include "core/error.h"
#include "data/dataset/gpt_test_data.h"
#include "parallel/pipeline_parallel.h"
#include "test_util.h"
#include "train/train_checkpoint.h"
#include "train/trainer.h"

namespace nk {
namespace {

using test::error_of;
using test::TempDir;
namespace fs = std::filesystem;

const int32_t kVocab = 300;

TrainConfig tiny(const std::vector<std::string>& extra) {
  std::vector<std::string> ov = {
      "model.preset=gpt-tiny", "model.n_layer=1",     "model.d_model=32",
      "model.n_head=2",        "model.d_ff=64",       "model.vocab_size=" + std::to_string(kVocab),
      "train.micro_batch=2",   "train.seq_len=16",    "train.global_batch=4",
      "train.steps=6",         "train.lr=3e-3",       "train.warmup_steps=1",
      "train.val_every=3",     "train.val_batches=2", "train.log_every=100",
      "train.peak_tflops=1",   "train.dtype=f32"};
  ov.insert(ov.end(), extra.begin(), extra.end());
  return train_config_from(Config::load(train_schema(), "", ov));
}

// Every training micro-batch's inputs and targets, by step.
struct Recorder {
  std::vector<std::pair<int64_t, std::vector<int32_t>>> batches;
  void attach(Trainer& t) {
    t.set_batch_observer([this](int64_t step, const Tensor& x, const Tensor& y) {
      std::vector<int32_t> v(x.data<int32_t>(), x.data<int32_t>() + x.numel());
      v.insert(v.end(), y.data<int32_t>(), y.data<int32_t>() + y.numel());
      batches.emplace_back(step, std::move(v));
    });
  }
};

void expect_resume_matches(const std::vector<std::string>& data_keys, const TempDir& dir) {
  const int64_t k = 2;
  TrainConfig straight_cfg = tiny(data_keys);
  straight_cfg.out_dir = dir / "straight";
  straight_cfg.metrics_file = dir / "straight.jsonl";
  Trainer straight(straight_cfg);
  Recorder all;
  all.attach(straight);
  straight.run();
  ASSERT_EQ(all.batches.size(), 12u);  // 6 steps x 2 micro-batches

  std::vector<std::string> first_keys = data_keys;
  first_keys.push_back("train.exit_at_step=" + std::to_string(k));
  first_keys.push_back("train.out_dir=" + (dir / "split"));
  Trainer first(tiny(first_keys));
  Recorder head;
  head.attach(first);
  first.run();
  EXPECT_EQ(first.state().step, k);
  EXPECT_EQ(first.state().consumed_samples, k * 4);
  ASSERT_TRUE(fs::exists(dir / "split/model/trainer_state.json"));

  std::vector<std::string> second_keys = data_keys;
  second_keys.push_back("train.resume_from=" + (dir / "split"));
  second_keys.push_back("train.out_dir=" + (dir / "split"));
  Trainer second(tiny(second_keys));
  EXPECT_EQ(second.state().step, k);
  Recorder tail;
  tail.attach(second);
  second.run();
  EXPECT_EQ(second.state().step, 6);
  EXPECT_EQ(second.state().consumed_samples, 24);

  // Steps 1..k, then k+1..6: the very same batches as the uninterrupted run.
  std::vector<std::pair<int64_t, std::vector<int32_t>>> joined = head.batches;
  joined.insert(joined.end(), tail.batches.begin(), tail.batches.end());
  ASSERT_EQ(joined.size(), all.batches.size());
  for (size_t i = 0; i < joined.size(); ++i) {
    EXPECT_EQ(joined[i].first, all.batches[i].first) << i;
    EXPECT_EQ(joined[i].second, all.batches[i].second) << "micro-batch " << i;
  }
  // Weights, optimizer moments and positions come back bit for bit, so every
  // resumed step's loss is the same (tests/train/checkpoint_test.cc goes further).
  ASSERT_EQ(second.history().size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(second.history()[i].loss, straight.history()[k + i].loss) << i;
  // The resumed metrics continue the first part's file.
  std::string metrics = test::read_file(dir / "split/metrics.jsonl");
  EXPECT_NE(metrics.find("\"step\": 1,"), std::string::npos) << metrics.substr(0, 200);
  EXPECT_NE(metrics.find("\"step\": 6,"), std::string::npos);
}

TEST(TrainerResume, IndexedDatasetReadsTheSameSamples) {
  TempDir dir("nk_resume");
  std::string prefix = test::write_random_dataset(dir / "ds", 300, 60, kVocab, 1);
  expect_resume_matches({"data.prefix=" + prefix, "data.split=90,10,0"}, dir);
  // Validation read the valid split.
  Trainer t(tiny({"data.prefix=" + prefix, "data.split=90,10,0", "train.out_dir=" + (dir / "v")}));
  EXPECT_FALSE(std::isnan(t.evaluate()));
}

TEST(TrainerResume, BlendReadsTheSameSamples) {
  TempDir dir("nk_resume");
  std::string a = test::write_random_dataset(dir / "a", 200, 60, kVocab, 2);
  std::string b = test::write_random_dataset(dir / "b", 100, 60, kVocab, 3);
  expect_resume_matches({"data.blend=0.3," + a + ",0.7," + b, "data.cache_dir=" + (dir / "cache")},
                        dir);
  EXPECT_TRUE(fs::exists(dir / "cache"));
}

TEST(TrainerResume, TextCorpusReadsTheSameSamples) {
  TempDir dir("nk_resume");
  std::string text;
  for (int i = 0; i < 200; ++i) text += "Line " + std::to_string(i) + " of a small corpus.\n";
  test::write_file(dir / "c.txt", text);
  expect_resume_matches({"data.path=" + (dir / "c.txt")}, dir);
}

TEST(TrainerResume, ChangedDataSettingsAreRefused) {
  TempDir dir("nk_resume");
  std::string prefix = test::write_random_dataset(dir / "ds", 300, 60, kVocab, 1);
  Trainer first(
      tiny({"data.prefix=" + prefix, "train.exit_at_step=1", "train.out_dir=" + (dir / "run")}));
  first.run();
  std::string msg = error_of([&] {
    Trainer t(tiny({"data.prefix=" + prefix, "train.seed=99", "train.resume_from=" + (dir / "run"),
                    "train.out_dir=" + (dir / "run")}));
  });
  EXPECT_NE(msg.find("train.seed was '1234' in the saved run but is '99' now"), std::string::npos)
      << msg;
  msg = error_of([&] {
    Trainer t(tiny({"data.prefix=" + prefix, "train.resume_from=" + (dir / "nowhere")}));
  });
  EXPECT_NE(msg.find("train.resume_from: no trainer state"), std::string::npos) << msg;
}

TEST(TrainerData, BadDataSettingsAreNamed) {
  TempDir dir("nk_resume");
  std::string prefix = test::write_random_dataset(dir / "ds", 300, 60, kVocab, 1);
  std::string small = test::write_random_dataset(dir / "small", 4, 3, kVocab, 1);
  std::string big_ids = test::write_random_dataset(dir / "big", 100, 60, 1000, 1);
  auto msg_of = [&](const std::vector<std::string>& keys) {
    return error_of([&] {
      std::vector<std::string> k = keys;
      k.push_back("train.out_dir=" + (dir / "out"));
      Trainer t(tiny(k));
      t.run();
    });
  };
  std::string m = msg_of({"data.prefix=" + big_ids});
  EXPECT_NE(m.find(big_ids), std::string::npos) << m;
  EXPECT_NE(m.find("outside the model's vocabulary [0, 300) (model.vocab_size)"), std::string::npos)
      << m;
  m = msg_of({"data.blend=0.3," + prefix + ",0.7"});
  EXPECT_NE(m.find("data.blend: 3 items"), std::string::npos) << m;
  m = msg_of({"data.blend=-1," + prefix + ",2," + prefix});
  EXPECT_NE(m.find("data.blend: weight -1"), std::string::npos) << m;
  m = msg_of({"data.prefix=" + prefix, "data.split=90,5,3,2"});
  EXPECT_NE(m.find("data.split: split '90,5,3,2': 4 parts"), std::string::npos) << m;
  m = msg_of({"data.prefix=" + small});
  EXPECT_NE(m.find("data.prefix: '" + small + "'"), std::string::npos) << m;
  EXPECT_NE(m.find("fewer than one sample of seq_len + 1 = 17"), std::string::npos) << m;
  m = msg_of({"data.prefix=" + (dir / "missing")});
  EXPECT_NE(m.find("data.prefix"), std::string::npos) << m;
  EXPECT_NE(m.find("missing"), std::string::npos) << m;
  m = msg_of({"data.prefix=" + prefix, "data.path=" + (dir / "x.txt")});
  EXPECT_NE(m.find("only one of data.path, data.prefix, data.blend and data.sft_path"),
            std::string::npos)
      << m;
  m = msg_of({"data.prefix=" + prefix, "train.exit_at_step=7"});
  EXPECT_NE(m.find("train.exit_at_step"), std::string::npos) << m;
}

}  // namespace
// train.init_from under pipeline parallelism: a stage reads its own layers'
// tensors of the saved model (the same values as the whole model's), and
// the last stage draws a head the run adds (score, value) as one process.
TEST(TrainerInitFrom, APipelineStageReadsItsOwnTensors) {
  TempDir dir("nk_init_stage");
  // (data.path is never read: only the model is loaded.)
  const std::vector<std::string> two = {"model.n_layer=2",
                                        "data.path=" + (dir.path() / "unread.txt").string()};
  Transformer saved(tiny(two).model, DType::F32, 7);
  save_model((dir.path() / "base").string(), saved);
  std::vector<std::string> init = two;
  init.push_back("train.init_from=" + (dir.path() / "base").string());
  TrainConfig cfg = tiny(init);
  for (int64_t s = 0; s < 2; ++s) {
    const PipelineStage stage = parallel::pipeline_stage(cfg.model, 2, s, {}, 1);
    std::unique_ptr<Transformer> m =
        load_run_model(cfg, cfg.init_from, "train.init_from", {}, stage);
    EXPECT_LT(m->layout().total(), saved.layout().total()) << "stage " << s;
    for (const ParamInfo& p : m->layout().params()) {
      const Tensor a = m->param_f32(p), b = saved.param_f32(saved.layout().find(p.name));
      ASSERT_EQ(a.numel(), b.numel()) << p.name;
      for (int64_t i = 0; i < a.numel(); ++i)
        ASSERT_EQ(a.data<float>()[i], b.data<float>()[i]) << p.name << " stage " << s;
    }
  }
  // A reward model's score head and a PPO policy's value head, drawn from
  // the seed: the last stage draws the one process's, and reads the rest of
  // its tensors from the file.
  for (const char* head : {"score.weight", "value_head.weight"}) {
    TrainConfig c = cfg;
    if (head == std::string("score.weight"))
      c.model.num_labels = 2;
    else
      c.model.value_head = true;
    const PipelineStage last = parallel::pipeline_stage(c.model, 2, 1, {}, 1);
    std::unique_ptr<Transformer> one = load_run_model(c, c.init_from, "train.init_from");
    std::unique_ptr<Transformer> piece =
        load_run_model(c, c.init_from, "train.init_from", {}, last);
    for (const ParamInfo& p : piece->layout().params()) {
      const Tensor a = piece->param_f32(p), b = one->param_f32(one->layout().find(p.name));
      ASSERT_EQ(a.numel(), b.numel()) << p.name;
      for (int64_t i = 0; i < a.numel(); ++i)
        ASSERT_EQ(a.data<float>()[i], b.data<float>()[i]) << p.name;
    }
    EXPECT_TRUE(piece->layout().has(head)) << head;
  }
}

}  // namespace nk
