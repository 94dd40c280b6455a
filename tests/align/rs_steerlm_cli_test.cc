// `nekton align align.method=rs|steerlm` and `nekton generate
// generate.steerlm_attributes` end to end, the parts that need no reward
// model: bad input stops before anything is written; SteerLM's conditioned
// data trains, and generation conditions its prompt exactly as the data
// was written; bad attribute names and values are errors naming the line.
#include <gtest/gtest.h>

#include <filesystem>

#include "serve/serve_test_util.h"
#include "test_util.h"

namespace nk {
namespace {

using json = nlohmann::json;
using test::contains;
using test::TempDir;
namespace fs = std::filesystem;

std::vector<json> read_jsonl(const std::string& path) {
  std::vector<json> v;
  std::istringstream in(test::read_file(path));
  for (std::string s; std::getline(in, s);)
    if (!s.empty()) v.push_back(json::parse(s));
  return v;
}

TEST(RsCli, BadInputStopsBeforeWritingAnything) {
  TempDir dir("nk_rs_bad");
  const std::string policy = dir / "policy";
  test::save_ascii_model(policy, 256);
  test::write_file(dir / "no_prompt.jsonl", "{\"prompt\": \"a\"}\n\n{\"text\": \"b\"}\n");
  test::write_file(dir / "empty.jsonl", "\n");
  test::write_file(
      dir / "mixed.jsonl",
      "{\"prompt\": \"a\"}\n{\"prompt\": [{\"role\": \"user\", \"content\": \"b\"}]}\n");
  test::write_file(dir / "ok.jsonl", "{\"prompt\": \"a\"}\n");
  test::write_file(dir / "long.jsonl",
                   "{\"prompt\": \"a\"}\n{\"prompt\": \"" + std::string(300, 'x') + "\"}\n");
  const std::string out = dir / "run";
  auto run = [&](const std::string& data, const std::string& extra) {
    return test::run_nekton("align align.method=rs train.init_from=" + policy +
                            " align.reward_model=" + policy + " align.data_path=" + (dir / data) +
                            " train.out_dir=" + out + " " + extra);
  };
  struct Case {
    std::string data, extra, message;
  } cases[] = {
      {"no_prompt.jsonl", "", "no_prompt.jsonl:3: no \"prompt\""},
      {"empty.jsonl", "", "align.data_path: " + (dir / "empty.jsonl") + ": no record"},
      {"mixed.jsonl", "", "mixed.jsonl:2: prompt: a chat prompt where"},
      {"ok.jsonl", "align.num_rollouts_per_prompt=0",
       "align.num_rollouts_per_prompt: must be >= 1, got 0"},
      {"ok.jsonl", "align.num_rollouts_per_prompt=2 align.top_n_rollouts=3",
       "align.top_n_rollouts: 3 is more than the 2 samples"},
      {"ok.jsonl", "align.reward_threshold=high", "align.reward_threshold: 'high'"},
      {"missing.jsonl", "", "align.data_path: "},
      {"long.jsonl", "",
       "long.jsonl:2: prompt: 300 tokens leave no room for a sample in "
       "train.init_from's context of 256"},
  };
  for (const Case& c : cases) {
    const test::RunResult r = run(c.data, c.extra);
    EXPECT_NE(r.code, 0) << c.message;
    EXPECT_TRUE(contains(r.out, c.message)) << r.out;
    EXPECT_FALSE(fs::exists(out)) << c.message;
  }
  const test::RunResult no_rm =
      test::run_nekton("align align.method=rs train.init_from=" + policy +
                       " align.data_path=" + (dir / "ok.jsonl") + " train.out_dir=" + out);
  EXPECT_TRUE(contains(no_rm.out, "align.reward_model: align.method=rs scores")) << no_rm.out;
  const test::RunResult no_policy =
      test::run_nekton("align align.method=rs align.reward_model=" + policy +
                       " align.data_path=" + (dir / "ok.jsonl") + " train.out_dir=" + out);
  EXPECT_TRUE(contains(no_policy.out, "train.init_from: align.method=rs needs")) << no_policy.out;
  EXPECT_FALSE(fs::exists(out));
}

const char* kSteerData =
    R"({"prompt": "say a", "response": " aaa", "helpfulness": 4, "correctness": 3, "coherence": 4, "complexity": 1, "verbosity": 0}
{"prompt": "say b", "response": " bbb", "label": "verbosity:4,helpfulness:1,correctness:0,coherence:2,complexity:1"}
)";

TEST(SteerLmCli, ConditionedSftTrainsAndGenerationConditionsAlike) {
  TempDir dir("nk_steerlm_cli");
  const std::string policy = dir / "policy";
  test::save_ascii_model(policy, 256);
  test::write_file(dir / "data.jsonl", kSteerData);
  const std::string out = dir / "run";
  const test::RunResult r =
      test::run_nekton("align align.method=steerlm train.init_from=" + policy +
                       " align.data_path=" + (dir / "data.jsonl") +
                       " \"align.steerlm_template=<extra_id_2>{attributes}\" train.out_dir=" + out +
                       " train.dtype=f32 train.steps=3 train.seq_len=128 train.micro_batch=2 "
                       "train.global_batch=2 train.threads=2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "steerlm: 2 records (0 with values from the attribute model)"))
      << r.out;
  const std::vector<json> sft = read_jsonl(out + "/steerlm_sft.jsonl");
  ASSERT_EQ(sft.size(), 2u);
  EXPECT_EQ(sft[1]["input"],
            "<extra_id_2>helpfulness:1,correctness:0,coherence:2,complexity:1,verbosity:4\nsay b");
  EXPECT_EQ(sft[1]["output"], " bbb");
  ASSERT_TRUE(fs::exists(out + "/model/steerlm.json")) << r.out;
  EXPECT_EQ(test::logged_losses(out + "/metrics.jsonl").size(), 3u);
  // Generation with the same values, given in another order, sees the same prompt.
  const test::RunResult g = test::run_nekton(
      "generate generate.model=" + out +
          "/model \"generate.prompt=say b\" generate.max_tokens=0 "
          "generate.steerlm_attributes=helpfulness:1,correctness:0,verbosity:4,coherence:2,"
          "complexity:1",
      false);
  ASSERT_EQ(g.code, 0) << g.out;
  EXPECT_EQ(g.out, sft[1]["input"].get<std::string>() + "\n");
  const test::RunResult bad = test::run_nekton("generate generate.model=" + out +
                                               "/model generate.max_tokens=0 "
                                               "generate.steerlm_attributes=helpfulness:9");
  EXPECT_NE(bad.code, 0);
  EXPECT_TRUE(contains(bad.out, "generate.steerlm_attributes: helpfulness: 9 is outside [0, 4]"))
      << bad.out;
}

TEST(SteerLmCli, ChatPromptsGetTheLabelAsTheirSystemMessage) {
  TempDir dir("nk_steerlm_chat");
  const std::string policy = dir / "policy";
  test::save_ascii_model(policy, 256);
  test::write_file(
      dir / "data.jsonl",
      R"({"prompt": [{"role": "system", "content": "be kind"}, {"role": "user", "content": "hi"}], "response": "hello", "label": "a:1,b:2"})"
      "\n"
      R"({"prompt": [{"role": "user", "content": "bye"}], "response": "ciao", "a": 0, "b": 3})"
      "\n");
  const std::string out = dir / "run";
  const test::RunResult r =
      test::run_nekton("align align.method=steerlm train.init_from=" + policy +
                       " align.data_path=" + (dir / "data.jsonl") +
                       " align.steerlm_attributes=a,b align.steerlm_max=3 train.out_dir=" + out +
                       " train.dtype=f32 train.steps=1 train.seq_len=128 train.micro_batch=2 " +
                       "train.global_batch=2 train.threads=2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "chat template chatml")) << r.out;
  const std::vector<json> sft = read_jsonl(out + "/steerlm_sft.jsonl");
  ASSERT_EQ(sft.size(), 2u);
  EXPECT_EQ(sft[0]["messages"], json::parse(R"([{"role": "system", "content": "a:1,b:2\nbe kind"},
      {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])"));
  EXPECT_EQ(sft[1]["messages"][0], json::parse(R"({"role": "system", "content": "a:0,b:3"})"));
  const json spec = json::parse(test::read_file(out + "/model/steerlm.json"));
  EXPECT_EQ(spec["attributes"], json::parse(R"(["a", "b"])"));
  EXPECT_EQ(spec["max"], 3);
  // A template without a system role refuses the conditioned prompt: an error
  // naming the line before anything is written.
  const std::string gemma = dir / "gemma";
  const test::RunResult g =
      test::run_nekton("align align.method=steerlm train.init_from=" + policy +
                       " align.data_path=" + (dir / "data.jsonl") +
                       " align.steerlm_attributes=a,b align.steerlm_max=3 " +
                       "data.chat_template=gemma train.out_dir=" + gemma);
  EXPECT_NE(g.code, 0);
  EXPECT_TRUE(
      contains(g.out, "data.jsonl:1: chat template gemma: the system role is not supported"))
      << g.out;
  EXPECT_FALSE(fs::exists(gemma));
}

TEST(SteerLmCli, BadAttributesAreErrorsNamingTheLine) {
  TempDir dir("nk_steerlm_bad");
  const std::string policy = dir / "policy";
  test::save_ascii_model(policy, 256);
  const std::string out = dir / "run";
  const std::string good =
      R"({"prompt": "a", "response": "b", "label": "helpfulness:1,correctness:0,coherence:2,complexity:1,verbosity:4"})";
  struct Case {
    std::string line, extra, message;
  } cases[] = {
      {R"({"prompt": "a", "response": "b", "label": "helpfulness:1,humor:2"})", "",
       "data.jsonl:2: label: unknown attribute 'humor'"},
      {R"({"prompt": "a", "response": "b", "helpfulness": 7, "correctness": 0, "coherence": 2, "complexity": 1, "verbosity": 4})",
       "", "data.jsonl:2: helpfulness: 7 is outside [0, 4]"},
      {R"({"prompt": "a", "response": "b", "helpfulness": "x", "correctness": 0, "coherence": 2, "complexity": 1, "verbosity": 4})",
       "", "data.jsonl:2: helpfulness: must be an integer"},
      {R"({"prompt": "a", "response": "b", "helpfulness": 1})", "",
       "data.jsonl:2: attribute 'correctness' has no value"},
      {R"({"prompt": "a", "label": "helpfulness:1"})", "", "data.jsonl:2: no \"response\""},
      {R"({"response": "b"})", "", "data.jsonl:2: no \"prompt\""},
      {R"({"prompt": "a", "response": "b", "q": 1, "label": "q:1"})",
       "align.steerlm_attributes=q,q", "align.steerlm_attributes: attribute 'q' named twice"},
  };
  for (const Case& c : cases) {
    test::write_file(dir / "data.jsonl", good + "\n" + c.line + "\n");
    const test::RunResult r = test::run_nekton(
        "align align.method=steerlm train.init_from=" + policy +
        " align.data_path=" + (dir / "data.jsonl") + " train.out_dir=" + out + " " + c.extra);
    EXPECT_NE(r.code, 0) << c.message;
    EXPECT_TRUE(contains(r.out, c.message)) << r.out;
    EXPECT_FALSE(fs::exists(out)) << c.message;
  }
}

}  // namespace
}  // namespace nk

namespace nk {
namespace {

TEST(RsCli, HelpListsTheKeys) {
  const test::RunResult r = test::run_nekton("align --help");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* key :
       {"align.method=rs", "align.method=steerlm", "align.reward_model",
        "align.num_rollouts_per_prompt", "align.top_n_rollouts", "align.reward_threshold",
        "align.rs_sft", "align.attribute_model", "align.steerlm_attributes",
        "align.steerlm_template", "align.output_path"})
    EXPECT_TRUE(test::contains(r.out, key)) << key;
  const test::RunResult g = test::run_nekton("generate --help");
  EXPECT_TRUE(test::contains(g.out, "generate.steerlm_attributes")) << g.out;
}

}  // namespace
}  // namespace nk
