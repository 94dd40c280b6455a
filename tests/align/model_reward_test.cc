// Online RL's reward-model reward (align.reward_funcs=model) on a tiny random
// sequence classifier made here: each (prompt, completion) scored as the
// RewardScorer scores its rendering, chat prompts included; an empty
// completion gets the call's lowest score; a causal LM or a classifier of two
// labels is refused naming align.reward_model.
#include <gtest/gtest.h>

#include "align/reward_scoring.h"
#include "align/rewards/reward_set.h"
#include "ckpt/model_io.h"
#include "data/chat/chat_template.h"
#include "serve/serve_test_util.h"
#include "test_util.h"

namespace nk {
namespace {

using json = nlohmann::json;
using test::contains;

// A random GPT-2 sequence classifier over bytes with `labels` and ChatML.
void save_classifier(const std::string& dir, const std::vector<std::string>& labels) {
  ModelConfig c;
  c.arch = "gpt2";
  c.vocab_size = 257;
  c.max_seq_len = 128;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_kv_head = 2;
  c.d_model = 32;
  c.d_ff = 64;
  c.tied_embeddings = false;
  c.init_std = 0.5;
  c.num_labels = int64_t(labels.size());
  c.labels = labels;
  Transformer m(c, DType::F32, 7);
  save_model(dir, m);
  store_tokenizer("bytes", dir);
  test::write_file(dir + "/tokenizer_config.json",
                   json{{"chat_template", find_chat_template("chatml").jinja()}}.dump());
}

RewardsConfig model_config() {
  RewardsConfig c;
  c.funcs = "model,length";
  c.weights = "2,1";
  c.length.max_tokens = 100;
  return c;
}

TEST(ModelReward, ScoresEachRolloutAsTheRewardModelDoes) {
  test::TempDir dir("nk_model_reward");
  const std::string rm = dir / "rm", policy = dir / "policy";
  save_classifier(rm, {"reward"});
  test::save_ascii_model(policy, 256);
  RewardModelSource src;
  src.dir = rm;
  src.policy_dir = policy;
  src.batch = 2;
  RewardSet set(model_config(), src);
  const json chat = json::array({{{"role", "user"}, {"content", "add 2 and 3"}}});
  const json text = "Q: add 2 and 3\nA:";
  const std::vector<json> records(4, json::object());
  std::vector<RewardInput> in = {{&records[0], &text, " 5", 1},
                                 {&records[1], &chat, "It is 5.", 8},
                                 {&records[2], &text, "", 0},
                                 {&records[3], &chat, "It is six.", 10}};
  const RewardScores s = set.score(in);
  ASSERT_EQ(s.parts.size(), 2u);
  EXPECT_EQ(s.parts[0].name, "model");
  const RewardScorer scorer("rm", rm, "auto", policy, "f32", kHost, 8);
  std::vector<std::vector<int32_t>> seqs;
  for (size_t i : {0, 1, 3})
    seqs.push_back(render_sequence(*in[i].prompt, in[i].completion, scorer.renderer(), "t"));
  const std::vector<std::vector<float>> want = scorer.score(seqs);
  EXPECT_NEAR(s.parts[0].values[0], want[0][0], 1e-5);
  EXPECT_NEAR(s.parts[0].values[1], want[1][0], 1e-5);
  EXPECT_NEAR(s.parts[0].values[3], want[2][0], 1e-5);
  EXPECT_NE(s.parts[0].values[0], s.parts[0].values[1]);
  const double lowest = std::min({want[0][0], want[1][0], want[2][0]});
  EXPECT_NEAR(s.parts[0].values[2], lowest, 1e-5);  // the empty completion
  for (size_t i = 0; i < 4; ++i)
    EXPECT_DOUBLE_EQ(s.total[i], 2 * s.parts[0].values[i] + s.parts[1].values[i]);
}

TEST(ModelReward, RefusesWhatIsNotAOneLabelClassifier) {
  test::TempDir dir("nk_model_reward_bad");
  const std::string two = dir / "two", policy = dir / "policy";
  save_classifier(two, {"helpfulness", "verbosity"});
  test::save_ascii_model(policy, 256);
  auto error = [&](const std::string& folder) -> std::string {
    RewardModelSource src;
    src.dir = folder;
    src.policy_dir = policy;
    try {
      RewardSet set(model_config(), src);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  std::string e = error(two);
  EXPECT_TRUE(contains(e, "align.reward_model '" + two + "': 2 labels (helpfulness, verbosity)"))
      << e;
  e = error(policy);
  EXPECT_TRUE(contains(e, "align.reward_model '" + policy + "': a causal LM")) << e;
  e = error("");
  EXPECT_TRUE(contains(e, "align.reward_model: align.reward_funcs lists model")) << e;
}

}  // namespace
}  // namespace nk
