// Reward models end to end: `nekton align align.method=rm` on a synthetic
// preference set (chosen completions are a fixed marker, rejected ones
// random letters) ranks held-out pairs above 0.9; `nekton eval reward`
// scores them alike; the model exports as Hugging Face's
// LlamaForSequenceClassification (score.weight, id2label) and imports back
// with the same scores; generate, serve, perplexity and GGUF export refuse
// it by name; LoRA trains the score head with the adapters; a
// reward model is refused where an LM is needed, and bad settings and data
// are clear errors that write nothing.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "align/marker_pairs.h"
#include "ckpt/safetensors.h"
#include "test_util.h"

namespace nk {
namespace {

using test::contains;
using test::TempDir;
namespace fs = std::filesystem;

std::string rm_args(const TempDir& dir, const std::string& out, int steps) {
  return fmt::format(
      "align model.preset=llama-tiny train.dtype=f32 train.seq_len=16 train.micro_batch=16 "
      "train.global_batch=16 train.steps={} train.lr=3e-3 train.min_lr=3e-4 "
      "train.warmup_steps=0 train.peak_tflops=1 train.threads=2 train.val_every={} "
      "train.val_batches=2 align.method=rm align.data_path={} align.valid_path={} "
      "train.out_dir={}",
      steps, steps, dir / "train.jsonl", dir / "valid.jsonl", out);
}

double value_after(const std::string& text, const std::string& key) {
  const size_t at = text.rfind(key);
  if (at == std::string::npos) return NAN;
  return std::stod(text.substr(at + key.size()));
}

TEST(RewardCli, LearnsThePairsAndExportsToHuggingFaceAndBack) {
  TempDir dir("nk_rm");
  test::write_marker_pairs(dir / "train.jsonl", 256, 1);
  test::write_marker_pairs(dir / "valid.jsonl", 32, 2);
  const std::string out = dir / "run";
  const test::RunResult r = test::run_nekton(rm_args(dir, out, 40));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "rewards/accuracies")) << r.out;
  EXPECT_FALSE(contains(r.out, "reference")) << r.out;  // a reward model has none

  const std::string eval = "eval reward eval.model=" + out +
                           "/model eval.data=" + (dir / "valid.jsonl") + " eval.output=";
  const test::RunResult e = test::run_nekton(eval + (dir / "scores.jsonl"), false);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_TRUE(contains(e.out, "pairs 32")) << e.out;
  EXPECT_GT(value_after(e.out, "accuracy "), 0.9) << e.out;
  EXPECT_GT(value_after(e.out, "mean margin "), 0) << e.out;

  // One response at a time: the marker scores above random letters.
  test::write_file(dir / "responses.jsonl", R"({"prompt": "say qrs:", "response": " END"})"
                                            "\n"
                                            R"({"prompt": "say qrs:", "response": "xkcd"})"
                                            "\n");
  const test::RunResult one = test::run_nekton("eval reward eval.model=" + out +
                                                   "/model eval.data=" + (dir / "responses.jsonl") +
                                                   " eval.output=" + (dir / "one.jsonl"),
                                               false);
  ASSERT_EQ(one.code, 0) << one.out;
  EXPECT_TRUE(contains(one.out, "responses 2")) << one.out;
  {
    std::istringstream in(test::read_file(dir / "one.jsonl"));
    std::string l1, l2;
    std::getline(in, l1);
    std::getline(in, l2);
    EXPECT_GT(nlohmann::json::parse(l1)["score"].get<double>(),
              nlohmann::json::parse(l2)["score"].get<double>())
        << l1 << " " << l2;
  }

  // A record without its prompt names its line, and nothing is written.
  test::write_file(dir / "responses.jsonl", R"({"response": " END"})"
                                            "\n");
  const test::RunResult bad = test::run_nekton("eval reward eval.model=" + out +
                                               "/model eval.data=" + (dir / "responses.jsonl") +
                                               " eval.output=" + (dir / "bad.jsonl"));
  EXPECT_NE(bad.code, 0);
  EXPECT_TRUE(contains(bad.out, "responses.jsonl:1: no \"prompt\"")) << bad.out;
  EXPECT_FALSE(fs::exists(dir / "bad.jsonl"));

  // Hugging Face's sequence classifier, and back.
  ASSERT_EQ(test::run_nekton("export hf " + out + "/model " + (dir / "hf") + " --dtype f32").code,
            0);
  const nlohmann::json cfg = nlohmann::json::parse(test::read_file(dir / "hf/config.json"));
  EXPECT_EQ(cfg["architectures"][0], "LlamaForSequenceClassification");
  EXPECT_EQ(cfg["id2label"].size(), 1u);
  SafetensorsFile st = SafetensorsFile::open(dir / "hf/model.safetensors");
  ASSERT_TRUE(st.has("score.weight"));
  EXPECT_EQ(st.entry("score.weight").shape, (Shape{1, 64}));
  EXPECT_FALSE(st.has("lm_head.weight"));
  ASSERT_EQ(test::run_nekton("import hf " + (dir / "hf") + " " + (dir / "back")).code, 0);
  const test::RunResult b = test::run_nekton("eval reward eval.model=" + (dir / "back") +
                                                 " eval.data=" + (dir / "valid.jsonl") +
                                                 " eval.output=" + (dir / "back_scores.jsonl"),
                                             false);
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_EQ(test::read_file(dir / "back_scores.jsonl"), test::read_file(dir / "scores.jsonl"));

  // An LM's commands refuse a reward model by name.
  const test::RunResult g =
      test::run_nekton("generate generate.model=" + out + "/model generate.prompt=hi");
  EXPECT_NE(g.code, 0);
  EXPECT_TRUE(contains(g.out, "a sequence classifier (num_labels = 1")) << g.out;
  const test::RunResult sv = test::run_nekton("serve --model " + out + "/model serve.port=0");
  EXPECT_NE(sv.code, 0);
  EXPECT_TRUE(contains(sv.out, "a sequence classifier (num_labels = 1")) << sv.out;
  test::write_file(dir / "text.txt", "say abc: END\n");
  const test::RunResult pp = test::run_nekton("eval perplexity eval.model=" + out +
                                              "/model eval.text=" + (dir / "text.txt"));
  EXPECT_NE(pp.code, 0);
  EXPECT_TRUE(contains(pp.out, "a sequence classifier (num_labels = 1")) << pp.out;
  const test::RunResult x = test::run_nekton("export gguf " + out + "/model " + (dir / "m.gguf"));
  EXPECT_NE(x.code, 0);
  EXPECT_TRUE(contains(x.out, "is a sequence classifier")) << x.out;
  EXPECT_FALSE(fs::exists(dir / "m.gguf"));
}

TEST(RewardCli, LoraTrainsTheScoreHeadWithTheAdapters) {
  TempDir dir("nk_rm_lora");
  test::write_marker_pairs(dir / "train.jsonl", 64, 3);
  test::write_marker_pairs(dir / "valid.jsonl", 16, 4);
  const std::string out = dir / "run", one = dir / "one";
  const std::string lora = " peft.method=lora peft.lora_rank=4";
  const test::RunResult r = test::run_nekton(rm_args(dir, out, 4) + lora);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "rewards/accuracies")) << r.out;
  // The score head trains: after 4 steps it is not what 1 step left.
  ASSERT_EQ(test::run_nekton(rm_args(dir, one, 1) + lora).code, 0);
  auto head = [](const std::string& run) {
    SafetensorsFile m = SafetensorsFile::open(run + "/model/model.safetensors");
    EXPECT_TRUE(m.has("score.weight"));
    Tensor t = m.get("score.weight");
    return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
  };
  EXPECT_NE(head(out), head(one));
  const test::RunResult e = test::run_nekton("eval reward eval.model=" + out +
                                             "/model eval.data=" + (dir / "valid.jsonl"));
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_TRUE(contains(e.out, "pairs 16")) << e.out;
}

TEST(RewardCli, BadSettingsAndDataAreErrorsThatWriteNothing) {
  TempDir dir("nk_rm_bad");
  test::write_marker_pairs(dir / "train.jsonl", 8, 1);
  test::write_marker_pairs(dir / "valid.jsonl", 4, 2);
  const std::string out = dir / "run";
  auto refused = [&](const std::string& extra, const std::string& message) {
    const test::RunResult r = test::run_nekton(rm_args(dir, out, 2) + " " + extra);
    EXPECT_NE(r.code, 0) << extra;
    EXPECT_TRUE(contains(r.out, message)) << extra << "\n" << r.out;
    EXPECT_FALSE(fs::exists(out)) << extra;
  };
  refused("model.num_labels=3", "model.num_labels: 3 with align.method=rm");
  refused("align.reference=copy", "a reward model has no reference model");
  refused("align.loss_type=ipo", "align.method=rm trains with the Bradley-Terry loss");
  // Margins go in every record or none.
  test::write_file(dir / "margins.jsonl",
                   R"({"prompt": "say a:", "chosen": " END", "rejected": "xy", "margin": 1})"
                   "\n"
                   R"({"prompt": "say b:", "chosen": " END", "rejected": "zz"})"
                   "\n");
  refused("align.data_path=" + (dir / "margins.jsonl"), "margins.jsonl:2: no \"margin\"");
  test::write_file(dir / "margins.jsonl",
                   R"({"prompt": "say a:", "chosen": " END", "rejected": "xy", "margin": "1"})"
                   "\n");
  refused("align.data_path=" + (dir / "margins.jsonl"), "margins.jsonl:1: margin: must be");

  // eval reward: a causal LM is not a reward model.
  const std::string lm = dir / "lm";
  ASSERT_EQ(test::run_nekton("align model.preset=llama-tiny train.dtype=f32 train.seq_len=16 "
                             "train.micro_batch=4 train.global_batch=4 train.steps=1 "
                             "align.method=simpo align.data_path=" +
                             (dir / "train.jsonl") + " train.out_dir=" + lm)
                .code,
            0);
  const test::RunResult e = test::run_nekton("eval reward eval.model=" + lm +
                                             "/model eval.data=" + (dir / "valid.jsonl"));
  EXPECT_NE(e.code, 0);
  EXPECT_TRUE(contains(e.out, "is a causal LM, not a reward model")) << e.out;
}

}  // namespace
}  // namespace nk
