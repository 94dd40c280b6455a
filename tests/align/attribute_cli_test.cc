// SteerLM's attribute model end to end: `nekton align align.method=rm
// align.reward_model_type=regression` on HelpSteer-style records made here
// (each response's "helpfulness" is how many '!' it holds, its "verbosity"
// its length over 4, some values null) brings the validation mean squared
// error far below the attributes' variance, logs one per attribute, exports
// as a Hugging Face classifier whose id2label names the attributes, fills
// SteerLM's missing values, and bad attribute data stops before anything is
// written.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "test_util.h"

namespace nk {
namespace {

using test::contains;
using test::TempDir;
namespace fs = std::filesystem;

void write_records(const std::string& path, int n, uint64_t seed) {
  Rng rng(seed);
  std::string out;
  for (int i = 0; i < n; ++i) {
    const int bangs = int(rng.below(4)), len = 2 + int(rng.below(8));
    std::string r;
    for (int k = 0; k < len; ++k) r += char('a' + rng.below(26));
    r += std::string(size_t(bangs), '!');
    nlohmann::json j = {{"prompt", "rate:"},
                        {"response", r},
                        {"helpfulness", bangs},
                        {"verbosity", double(r.size()) / 4}};
    if (i % 5 == 0) j["verbosity"] = nullptr;  // unlabelled: out of the loss
    out += j.dump() + "\n";
  }
  test::write_file(path, out);
}

std::string args(const TempDir& dir, const std::string& out, int steps) {
  return fmt::format(
      "align model.preset=llama-tiny train.dtype=f32 train.seq_len=24 train.micro_batch=16 "
      "train.global_batch=16 train.steps={} train.lr=3e-3 train.min_lr=3e-4 "
      "train.warmup_steps=0 train.peak_tflops=1 train.threads=2 train.val_every=20 "
      "train.val_batches=2 align.method=rm align.reward_model_type=regression "
      "align.steerlm_attributes=helpfulness,verbosity "
      "align.data_path={} align.valid_path={} train.out_dir={}",
      steps, dir / "train.jsonl", dir / "valid.jsonl", out);
}

std::vector<double> values_of(const std::string& metrics, const std::string& key) {
  std::vector<double> v;
  std::istringstream in(test::read_file(metrics));
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains(key)) v.push_back(j[key].get<double>());
  }
  return v;
}

TEST(AttributeCli, LearnsTheAttributesAndExportsTheirNames) {
  TempDir dir("nk_attr");
  write_records(dir / "train.jsonl", 256, 1);
  write_records(dir / "valid.jsonl", 32, 2);
  const std::string out = dir / "run";
  const test::RunResult r = test::run_nekton(args(dir, out, 60));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "mse/helpfulness")) << r.out;
  const std::vector<double> mse = values_of(out + "/metrics.jsonl", "val_mse");
  ASSERT_EQ(mse.size(), 3u) << r.out;
  // Far below the error of predicting each attribute's mean (its variance
  // over the validation records): the model reads the responses.
  double sq = 0, n = 0;
  for (const char* key : {"helpfulness", "verbosity"}) {
    std::vector<double> v;
    std::istringstream in(test::read_file(dir / "valid.jsonl"));
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (!j[key].is_null()) v.push_back(j[key].get<double>());
    }
    double mean = 0;
    for (double x : v) mean += x / double(v.size());
    for (double x : v) sq += (x - mean) * (x - mean);
    n += double(v.size());
  }
  EXPECT_LT(mse.back(), 0.3 * sq / n) << r.out;
  EXPECT_EQ(values_of(out + "/metrics.jsonl", "val_mse/verbosity").size(), 3u);

  ASSERT_EQ(test::run_nekton("export hf " + out + "/model " + (dir / "hf") + " --dtype f32").code,
            0);
  const nlohmann::json cfg = nlohmann::json::parse(test::read_file(dir / "hf/config.json"));
  EXPECT_EQ(cfg["architectures"][0], "LlamaForSequenceClassification");
  EXPECT_EQ(cfg["id2label"]["0"], "helpfulness");
  EXPECT_EQ(cfg["id2label"]["1"], "verbosity");
  // SteerLM fills records' missing values with it: 0 and 3 '!' read as
  // helpfulness 0 and 3.
  const std::string policy = dir / "policy", steer = dir / "steer";
  ASSERT_EQ(test::run_nekton("train model.preset=llama-tiny data.path=" + (dir / "train.jsonl") +
                             " data.tokenizer=bytes train.seq_len=32 train.micro_batch=2 "
                             "train.global_batch=2 train.steps=1 train.val_every=0 "
                             "train.out_dir=" +
                             policy)
                .code,
            0);
  test::write_file(dir / "fill.jsonl", R"({"prompt": "rate:", "response": "abcde"})"
                                       "\n"
                                       R"({"prompt": "rate:", "response": "abcde!!!"})"
                                       "\n");
  const test::RunResult s = test::run_nekton(
      "align align.method=steerlm train.init_from=" + policy + "/model align.attribute_model=" +
      out + "/model align.data_path=" + (dir / "fill.jsonl") + " train.out_dir=" + steer +
      " align.steerlm_sft=false align.steerlm_attributes=helpfulness,verbosity train.seq_len=32");
  ASSERT_EQ(s.code, 0) << s.out;
  const std::string sft = test::read_file(steer + "/steerlm_sft.jsonl");
  EXPECT_TRUE(contains(sft, R"("label":"helpfulness:0,verbosity:1")")) << sft;
  EXPECT_TRUE(contains(sft, R"("label":"helpfulness:3,verbosity:2")")) << sft;

  // nekton eval reward scores each record, one score per attribute; pairs
  // are ranked by a reward model's one output, not by two attributes.
  const test::RunResult e = test::run_nekton("eval reward eval.model=" + out +
                                                 "/model eval.data=" + (dir / "valid.jsonl") +
                                                 " eval.output=" + (dir / "scores.jsonl"),
                                             false);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_TRUE(contains(e.out, "responses 32")) << e.out;
  EXPECT_TRUE(contains(e.out, "mean verbosity ")) << e.out;
  EXPECT_TRUE(contains(test::read_file(dir / "scores.jsonl"), R"("scores":{"helpfulness":)"));
  test::write_file(dir / "pairs.jsonl", R"({"prompt": "rate:", "chosen": "a!", "rejected": "b"})"
                                        "\n");
  const test::RunResult p = test::run_nekton("eval reward eval.model=" + out +
                                             "/model eval.data=" + (dir / "pairs.jsonl"));
  EXPECT_NE(p.code, 0);
  EXPECT_TRUE(contains(p.out, "has 2 outputs")) << p.out;
}

TEST(AttributeCli, BadRecordsAndSettingsWriteNothing) {
  TempDir dir("nk_attr_bad");
  write_records(dir / "train.jsonl", 8, 1);
  write_records(dir / "valid.jsonl", 4, 2);
  const std::string out = dir / "run";
  auto refused = [&](const std::string& extra, const std::string& message) {
    const test::RunResult r = test::run_nekton(args(dir, out, 2) + " " + extra);
    EXPECT_NE(r.code, 0) << extra;
    EXPECT_TRUE(contains(r.out, message)) << extra << "\n" << r.out;
    EXPECT_FALSE(fs::exists(out)) << extra;
  };
  test::write_file(dir / "bad.jsonl",
                   R"({"prompt": "rate:", "response": "ab", "helpfulness": 1})"
                   "\n"
                   R"({"prompt": "rate:", "response": "ab", "helpfulness": "high"})"
                   "\n");
  refused("align.data_path=" + (dir / "bad.jsonl"), "bad.jsonl:2: helpfulness: an attribute");
  test::write_file(dir / "bad.jsonl", R"({"prompt": "rate:", "response": "ab"})"
                                      "\n");
  refused("align.data_path=" + (dir / "bad.jsonl"), "bad.jsonl:1: none of the attributes");
  test::write_file(dir / "bad.jsonl", R"({"prompt": "rate:", "helpfulness": 2})"
                                      "\n");
  refused("align.data_path=" + (dir / "bad.jsonl"), "bad.jsonl:1: no \"response\"");
  refused("align.steerlm_attributes=a,a", "align.steerlm_attributes: 'a' is named twice");
  refused("model.num_labels=3", "model.num_labels: 3 with align.method=rm, which trains 2");
  refused("align.reward_model_type=ordinal",
          "align.reward_model_type: 'ordinal' is neither binary_ranking nor regression");
  const test::RunResult r = test::run_nekton(args(dir, out, 2) + " align.method=dpo");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.out,
                       "align.reward_model_type: regression trains an attribute model "
                       "with align.method=rm"))
      << r.out;
}

}  // namespace
}  // namespace nk
