// OnlineObjective's rounds: the generator decodes from the policy's live
// weights (a weight changed between two rounds changes what the next round
// samples: no copy, no stale cache), rounds are the same for a seed, a
// round file written mid-way reads back as it was (every replica's file of
// the round merged), and a reward function that fails is an error naming it.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <map>

#include "align/online_objective.h"
#include "align/preference_data.h"
#include "ckpt/model_io.h"
#include "core/allocator.h"
#include "data/chat/chat_template.h"
#include "data/dataset/data_loader.h"
#include "infer/generate.h"
#include "model/arch.h"
#include "model/tiny_config.h"
#include "test_util.h"

namespace nk {
namespace {

namespace fs = std::filesystem;

struct OnlineSetup {
  TrainConfig cfg;
  OnlineRlConfig rl;
  std::shared_ptr<OnlinePrompts> prompts;
  std::shared_ptr<Tokenizer> tok;
};

OnlineSetup setup(const std::string& out_dir) {
  OnlineSetup s;
  s.cfg.model = test::tiny_config(true, 257, 32);
  s.cfg.dtype = DType::F32;
  s.cfg.seq_len = 16;
  s.cfg.micro_batch = 4;
  s.cfg.global_batch = 8;
  s.cfg.seed = 3;
  s.cfg.out_dir = out_dir;
  RejectionSamplingOptions rs;
  rs.num_rollouts = 4;
  rs.max_tokens = 5;
  rs.sampling.temperature = 1.0;
  rs.sampling.seed = 11;
  s.rl.ppo_epochs = 2;
  s.rl.check("grpo", "grpo", rs, 8, 16, 8);
  s.tok = std::shared_ptr<Tokenizer>(load_tokenizer("bytes"));
  s.prompts = std::make_shared<OnlinePrompts>();
  s.prompts->records.file.path = "prompts.jsonl";
  for (const char* p : {"Q:ab=", "Q:cd=", "Q:ef=", "Q:gh="}) {
    s.prompts->records.file.records.push_back(
        {int64_t(s.prompts->tokens.size()) + 1, nlohmann::json{{"prompt", p}}});
    s.prompts->records.prompts.push_back(p);
    s.prompts->tokens.push_back(s.tok->encode(p));
  }
  return s;
}

// One part, "starts_z": 1 when the completion starts with 'z'.
RewardScores starts_z(std::span<const RewardInput> in) {
  RewardScores s;
  RewardScores::Part p{"starts_z", 1.0, true, {}};
  for (const RewardInput& x : in) {
    p.values.push_back(!x.completion.empty() && x.completion[0] == 'z' ? 1.0 : 0.0);
    s.total.push_back(p.values.back());
  }
  s.parts.push_back(std::move(p));
  return s;
}

TEST(OnlineObjective, RoundsSampleFromTheLiveWeights) {
  test::TempDir dir;
  OnlineSetup s = setup(dir.path().string());
  Transformer model(s.cfg.model, DType::F32, s.cfg.seed);
  OnlineObjective obj(s.cfg, s.rl, s.prompts, s.tok, {}, starts_z, ReferenceSource::Copy);
  obj.prepare(model, true);
  const int64_t U = s.rl.rounds_steps;
  ASSERT_EQ(U, 2);  // 4 prompts x 4 over a global batch of 8, twice
  obj.before_step(model, 0);
  auto r0 = obj.round();
  ASSERT_EQ(r0->samples.size(), 8u);
  obj.before_step(model, 1);  // the same round: nothing generated
  EXPECT_EQ(obj.round(), r0);
  // The optimizer's kind of change: the weights the policy holds replaced
  // in place (here by another initialisation's). The next round must be
  // what a generator over those weights draws, not over the old ones.
  Transformer other(s.cfg.model, DType::F32, s.cfg.seed + 6);
  ops::convert(model.params(), other.params());
  model.sync_compute_params();
  obj.before_step(model, 2);
  auto r1 = obj.round();
  EXPECT_EQ(r1->index, 1);
  auto round1_over = [&](Transformer& m) {
    OnlineObjective fresh(s.cfg, s.rl, s.prompts, s.tok, {}, starts_z, ReferenceSource::Copy);
    fresh.prepare(m, true);
    fresh.before_step(m, 2);
    return fresh.round();
  };
  Transformer old_weights(s.cfg.model, DType::F32, s.cfg.seed);
  auto want = round1_over(other), stale = round1_over(old_weights);
  int64_t differ = 0;
  for (size_t k = 0; k < r1->samples.size(); ++k) {
    EXPECT_EQ(r1->samples[k].tokens, want->samples[k].tokens) << k;
    differ += r1->samples[k].tokens != stale->samples[k].tokens;
  }
  EXPECT_GT(differ, 4) << "the old weights would have drawn the same round";
}

// A validation pass (align.valid_path): every validation prompt gets G
// completions from the live weights, scored by the reward functions, and the
// figures are those scores' and lengths'; the same weights give the same
// completions, other weights others; the training rounds are what they are
// without it.
TEST(OnlineObjective, ValidationScoresEveryPromptAndLeavesTheRoundsAlone) {
  test::TempDir dir;
  OnlineSetup s = setup(dir.path().string());
  auto valid = std::make_shared<OnlinePrompts>();
  valid->records.file.path = "valid.jsonl";
  for (const char* p : {"V:ij=", "V:kl=", "V:mn="}) {  // 2 prompts a round: batches of 2 and 1
    valid->records.file.records.push_back(
        {int64_t(valid->tokens.size()) + 1, nlohmann::json{{"prompt", p}}});
    valid->records.prompts.push_back(p);
    valid->tokens.push_back(s.tok->encode(p));
  }
  struct Seen {
    std::string prompt, completion;
    int64_t tokens;
  };
  std::vector<Seen> seen;
  auto scorer = [&](std::span<const RewardInput> in) {
    for (const RewardInput& x : in)
      seen.push_back({x.prompt->get<std::string>(), x.completion, x.completion_tokens});
    return starts_z(in);
  };
  Transformer model(s.cfg.model, DType::F32, s.cfg.seed);
  OnlineObjective obj(s.cfg, s.rl, s.prompts, s.tok, {}, scorer, ReferenceSource::Copy);
  obj.set_valid_prompts(valid);
  obj.prepare(model, true);
  obj.before_step(model, 0);
  auto figure = [](const ObjectiveMetrics& m, const std::string& name) -> double {
    for (const auto& [k, v] : m)
      if (k == name) return v;
    ADD_FAILURE() << "no " << name;
    return NAN;
  };
  seen.clear();
  const ObjectiveMetrics m = obj.validate(model);
  const int64_t G = s.rl.sampling.num_rollouts;
  ASSERT_EQ(int64_t(seen.size()), 3 * G);
  std::map<std::string, int64_t> per_prompt;
  double z = 0, len = 0;
  for (const Seen& x : seen) {
    ++per_prompt[x.prompt];
    z += !x.completion.empty() && x.completion[0] == 'z';
    len += double(x.tokens);
  }
  EXPECT_EQ(per_prompt, (std::map<std::string, int64_t>{{"V:ij=", G}, {"V:kl=", G}, {"V:mn=", G}}));
  EXPECT_DOUBLE_EQ(figure(m, "reward"), z / double(seen.size()));
  EXPECT_DOUBLE_EQ(figure(m, "rewards/starts_z/mean"), z / double(seen.size()));
  EXPECT_DOUBLE_EQ(figure(m, "completions/mean_length"), len / double(seen.size()));
  const std::vector<Seen> first = seen;
  seen.clear();
  EXPECT_EQ(obj.validate(model), m);  // the same weights, the same seeds
  int64_t same = 0;
  for (size_t i = 0; i < seen.size(); ++i) same += seen[i].completion == first[i].completion;
  EXPECT_EQ(same, int64_t(first.size()));
  // Other weights: other completions.
  Transformer other(s.cfg.model, DType::F32, s.cfg.seed + 6);
  ops::convert(model.params(), other.params());
  model.sync_compute_params();
  seen.clear();
  obj.validate(model);
  same = 0;
  for (size_t i = 0; i < seen.size(); ++i) same += seen[i].completion == first[i].completion;
  EXPECT_LT(same, int64_t(first.size()) / 2);
  // The next round is the one an objective without validation makes.
  obj.before_step(model, 2);
  OnlineObjective plain(s.cfg, s.rl, s.prompts, s.tok, {}, starts_z, ReferenceSource::Copy);
  plain.prepare(model, true);
  plain.before_step(model, 2);
  ASSERT_EQ(obj.round()->samples.size(), plain.round()->samples.size());
  for (size_t k = 0; k < plain.round()->samples.size(); ++k)
    EXPECT_EQ(obj.round()->samples[k].tokens, plain.round()->samples[k].tokens) << k;
}

TEST(OnlineObjective, RoundsAreTheSameForASeedAndReadBackMidRound) {
  test::TempDir dir;
  OnlineSetup s = setup(dir.path().string());
  auto round_of = [&](const std::string& out) {
    OnlineSetup t = s;
    t.cfg.out_dir = out;
    Transformer model(t.cfg.model, DType::F32, t.cfg.seed);
    OnlineObjective obj(t.cfg, t.rl, t.prompts, t.tok, {}, starts_z, ReferenceSource::Copy);
    obj.prepare(model, true);
    obj.before_step(model, 0);
    return obj.round();
  };
  auto a = round_of((dir.path() / "a").string()), b = round_of((dir.path() / "b").string());
  ASSERT_EQ(a->samples.size(), b->samples.size());
  for (size_t k = 0; k < a->samples.size(); ++k) {
    EXPECT_EQ(a->samples[k].tokens, b->samples[k].tokens) << k;
    EXPECT_EQ(a->samples[k].old_logp, b->samples[k].old_logp) << k;
  }
  // A run resumed at step 1 (mid-round) reads round 0 back from its file.
  Transformer other(s.cfg.model, DType::F32, s.cfg.seed + 5);  // weights that would sample others
  OnlineSetup t = s;
  t.cfg.out_dir = (dir.path() / "a").string();
  OnlineObjective resumed(t.cfg, t.rl, t.prompts, t.tok, {}, starts_z, ReferenceSource::Copy);
  resumed.prepare(other, false);
  resumed.before_step(other, 1);
  auto c = resumed.round();
  for (size_t k = 0; k < a->samples.size(); ++k) {
    EXPECT_EQ(a->samples[k].tokens, c->samples[k].tokens) << k;
    EXPECT_EQ(a->samples[k].old_logp, c->samples[k].old_logp) << k;
    EXPECT_EQ(a->samples[k].advantage, c->samples[k].advantage) << k;
  }
  // Without the file the resume is an error naming it, not a silent regeneration.
  fs::remove_all(dir.path() / "b" / "rollouts");
  t.cfg.out_dir = (dir.path() / "b").string();
  OnlineObjective lost(t.cfg, t.rl, t.prompts, t.tok, {}, starts_z, ReferenceSource::Copy);
  lost.prepare(other, false);
  EXPECT_THROW(
      {
        try {
          lost.before_step(other, 1);
        } catch (const Error& e) {
          EXPECT_TRUE(test::contains(e.what(), "round-0.rank-0.bin")) << e.what();
          EXPECT_TRUE(test::contains(e.what(), "mid-way through round 0")) << e.what();
          throw;
        }
      },
      Error);
}

// Each replica's round file holds the per-token values of the samples it
// trains: a run resumed under another layout merges every replica's file of
// the round; files whose samples differ are an error naming both, and only
// the round asked for (under its key) is read.
TEST(RolloutRounds, EveryReplicasFileIsMergedAndTheyMustAgree) {
  test::TempDir dir;
  OnlineSetup s = setup((dir.path() / "made").string());
  Transformer model(s.cfg.model, DType::F32, s.cfg.seed);
  OnlineObjective obj(s.cfg, s.rl, s.prompts, s.tok, {}, starts_z, ReferenceSource::Copy);
  obj.prepare(model, true);
  obj.before_step(model, 0);
  const RolloutRound whole = *obj.round();
  ASSERT_GE(whole.samples.size(), 4u);
  ASSERT_FALSE(whole.samples[0].old_logp.empty());
  const std::string out = (dir.path() / "resumed").string();
  RolloutRound halves[2] = {whole, whole};
  for (size_t k = 0; k < whole.samples.size(); ++k) {
    halves[k % 2].samples[k].old_logp.clear();
    halves[k % 2].samples[k].ref_logp.clear();
  }
  save_rollout_round(rollout_round_path(out, 0, 0), "key", halves[0]);
  save_rollout_round(rollout_round_path(out, 0, 1), "key", halves[1]);
  RolloutRound other_round = whole;
  other_round.index = 1;
  other_round.samples[0].old_logp.assign(whole.samples[0].old_logp.size(), 9.f);
  save_rollout_round(rollout_round_path(out, 1, 0), "key", other_round);
  save_rollout_round(rollout_round_path(out, 0, 2), "another key", other_round);
  std::vector<std::string> files;
  auto merged = load_rollout_round_of_every_rank(out, 0, "key", &files);
  ASSERT_TRUE(merged);
  EXPECT_EQ(files.size(), 2u);
  for (size_t k = 0; k < whole.samples.size(); ++k) {
    EXPECT_EQ(merged->samples[k].old_logp, whole.samples[k].old_logp) << k;
    EXPECT_EQ(merged->samples[k].ref_logp, whole.samples[k].ref_logp) << k;
  }
  EXPECT_FALSE(load_rollout_round_of_every_rank(out, 0, "a third key", nullptr));
  // Pruning before round 1 removes every rank's file of round 0.
  prune_rollout_rounds(out, 1);
  EXPECT_FALSE(fs::exists(rollout_round_path(out, 0, 0)));
  EXPECT_FALSE(fs::exists(rollout_round_path(out, 0, 1)));
  EXPECT_TRUE(fs::exists(rollout_round_path(out, 1, 0)));
  // A replica's file of other completions.
  halves[1].samples[2].tokens.back() ^= 1;
  save_rollout_round(rollout_round_path(out, 1, 1), "key", [&] {
    RolloutRound r = halves[1];
    r.index = 1;
    return r;
  }());
  const std::string e =
      test::error_of([&] { load_rollout_round_of_every_rank(out, 1, "key", nullptr); });
  EXPECT_TRUE(test::contains(e, "round-1.rank-1.bin: sample 2 of round 1 differs from")) << e;
  EXPECT_TRUE(test::contains(e, "round-1.rank-0.bin")) << e;
}

TEST(OnlineObjective, ANonFiniteRewardNamesTheRecord) {
  test::TempDir dir;
  OnlineSetup s = setup(dir.path().string());
  Transformer model(s.cfg.model, DType::F32, s.cfg.seed);
  auto bad = [](std::span<const RewardInput> in) {
    RewardScores r = starts_z(in);
    if (!r.total.empty()) r.total.back() = NAN;
    return r;
  };
  OnlineObjective obj(s.cfg, s.rl, s.prompts, s.tok, {}, bad, ReferenceSource::Copy);
  obj.prepare(model, true);
  try {
    obj.before_step(model, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "prompts.jsonl:")) << e.what();
    EXPECT_TRUE(test::contains(e.what(), "non-finite")) << e.what();
  }
}

// DAPO's dynamic sampling: groups whose rewards are all equal (here every
// completion of two of the four prompts scores 1) are dropped and further
// batches of prompts generated until the round holds groups of unequal
// rewards only; without it those groups stay, with zero advantages.
TEST(OnlineObjective, DynamicSamplingKeepsGroupsOfUnequalRewards) {
  test::TempDir dir;
  OnlineSetup s = setup(dir.path().string());
  auto scorer = [](std::span<const RewardInput> in) {
    RewardScores r;
    RewardScores::Part p{"mixed", 1.0, false, {}};
    for (const RewardInput& x : in) {
      const std::string prompt = x.prompt->get<std::string>();
      const bool flat = prompt == "Q:ab=" || prompt == "Q:cd=";
      const double odd = x.completion.empty() ? 0.0 : double(uint8_t(x.completion[0]) % 2);
      p.values.push_back(flat ? 1.0 : odd);
      r.total.push_back(p.values.back());
    }
    r.parts.push_back(std::move(p));
    return r;
  };
  auto flat_groups = [&](bool dynamic) {
    OnlineSetup t = s;
    t.rl.dynamic_sampling = dynamic;
    t.rl.dynamic_sampling_max_batches = 6;
    Transformer model(t.cfg.model, DType::F32, t.cfg.seed);
    OnlineObjective obj(t.cfg, t.rl, t.prompts, t.tok, {}, scorer, ReferenceSource::Copy);
    obj.prepare(model, true);
    obj.before_step(model, 0);
    int64_t flat = 0;
    const auto& r = obj.round()->samples;
    for (size_t g = 0; g < r.size(); g += 4) {
      bool same = true;
      for (size_t i = g; i < g + 4; ++i) same = same && r[i].reward == r[g].reward;
      flat += same;
      for (size_t i = g; same && i < g + 4; ++i) EXPECT_EQ(r[i].advantage, 0.0);
    }
    return flat;
  };
  EXPECT_GT(flat_groups(false), 0);  // the data has flat groups to drop
  EXPECT_EQ(flat_groups(true), 0);
}

// A GRPO step over a LoRA policy holds no second model: its peak (the
// round's generation over the live weights, the old and reference passes,
// one training micro-batch) stays within 1.3x a plain generate of the same
// requests plus the training micro-batch's own workspace. A frozen copy as
// the reference (what a full fine-tune needs) adds its weights and breaks it.
TEST(OnlineObjective, ALoraStepHoldsNoSecondModel) {
  test::TempDir dir;
  OnlineSetup s = setup(dir.path().string());
  s.cfg.model.d_model = 256;
  s.cfg.model.d_ff = 512;
  s.cfg.model.lora.rank = 8;
  s.cfg.model.lora.alpha = 16;
  s.cfg.model.lora.target_modules = {"all-linear"};
  s.rl.kl_coef = 0.05;
  s.rl.loss.kl_coef = 0.05;
  std::vector<std::string> frozen;
  const ParamLayout layout = Transformer::layout_for(s.cfg.model);
  for (const ParamInfo& p : layout.params())
    if (!p.adapter) frozen.push_back(p.name);
  s.cfg.frozen = frozen;
  Allocator& alloc = Allocator::get(kHost);
  auto grpo_step = [&](ReferenceSource ref) {
    Transformer model(s.cfg.model, DType::F32, s.cfg.seed, ParamInit::Random, frozen);
    const size_t live = alloc.live_bytes();
    alloc.reset_peak();
    OnlineObjective obj(s.cfg, s.rl, s.prompts, s.tok, {}, starts_z, ref);
    obj.prepare(model, true);
    obj.before_step(model, 0);
    DataLoader loader(obj.data(s.cfg).train, s.cfg.micro_batch, s.cfg.model.vocab_size);
    const int64_t B = s.cfg.micro_batch, T = s.cfg.seq_len;
    Tensor tokens = Tensor::empty({B, T}, DType::I32), targets = Tensor::empty({B, T}, DType::I32);
    loader.next(tokens, targets);
    const size_t before_train = alloc.peak_bytes();
    alloc.reset_peak();
    const size_t live_train = alloc.live_bytes();
    {
      Activations a(model, B, T, true);
      obj.train_micro_batch(model, a, MicroBatch{tokens, targets, tokens, targets}, 1.f);
    }
    const size_t train_ws = alloc.peak_bytes() - live_train;
    return std::pair{std::max(before_train, alloc.peak_bytes()) - live,
                     std::pair{train_ws, model.weight_bytes()}};
  };
  // The same requests through a plain Generator over the same model.
  Transformer model(s.cfg.model, DType::F32, s.cfg.seed, ParamInit::Random, frozen);
  std::vector<GenerationRequest> requests;
  for (int64_t k = 0; k < s.rl.samples; ++k) {  // the round's: 2 prompts x 4
    GenerationRequest q;
    q.prompt = s.prompts->tokens[size_t(k / 4)];
    q.max_new_tokens = s.rl.sampling.max_tokens;
    q.sampling.seed = uint64_t(k);
    requests.push_back(q);
  }
  const size_t live = alloc.live_bytes();
  alloc.reset_peak();
  {
    Generator gen(model, s.tok.get(), s.rl.sampling.batch);
    gen.run(requests);
  }
  const size_t gen_ws = alloc.peak_bytes() - live;
  const auto [lora_peak, ws] = grpo_step(ReferenceSource::AdapterOff);
  const auto [train_ws, weights] = ws;
  const double bound = 1.3 * double(gen_ws) + double(train_ws);
  std::printf(
      "generate %zu B, training micro-batch %zu B, GRPO step %zu B (bound %.0f), weights %zu B\n",
      gen_ws, train_ws, lora_peak, bound, weights);
  EXPECT_LE(double(lora_peak), bound) << "generate " << gen_ws << " B, training micro-batch "
                                      << train_ws << " B, weights " << weights << " B";
  const auto [copy_peak, ws2] = grpo_step(ReferenceSource::Copy);
  EXPECT_GT(double(copy_peak), bound)
      << "the check cannot see a second model of " << weights << " B";
}

}  // namespace
}  // namespace nk

namespace nk {
namespace {

// Each bad align.* value of online RL is an nk::Error naming its key (and
// PPO's single generation per prompt is allowed, GRPO's is not).
TEST(OnlineRlConfig, BadValuesNameTheirKey) {
  struct Bad {
    std::string method;
    std::function<void(OnlineRlConfig&, RejectionSamplingOptions&)> set;
    std::string key;
    std::string loss_type = "sigmoid";
  };
  auto nothing = [](OnlineRlConfig&, RejectionSamplingOptions&) {};
  const std::vector<Bad> bad = {
      {"grpo", [](auto& c, auto&) { c.epsilon = 0; }, "align.epsilon"},
      {"grpo", [](auto& c, auto&) { c.epsilon_high = -1; }, "align.epsilon_high"},
      {"grpo", [](auto& c, auto&) { c.kl_coef = -0.1; }, "align.kl_coef"},
      {"grpo", [](auto&, auto& s) { s.num_rollouts = 1; }, "align.num_generations"},
      {"ppo", [](auto&, auto& s) { s.num_rollouts = 0; }, "align.num_generations"},
      {"grpo", [](auto&, auto& s) { s.sampling.temperature = 0; }, "align.temperature"},
      {"grpo", [](auto&, auto& s) { s.max_tokens = 30; }, "train.seq_len"},
      {"grpo", [](auto& c, auto&) { c.rollout_prompts = 3; }, "align.rollout_prompts"},
      {"grpo", [](auto& c, auto&) { c.ppo_epochs = 0; }, "align.ppo_epochs"},
      {"grpo", [](auto& c, auto&) { c.scale_rewards = "rank"; }, "align.scale_rewards"},
      {"grpo", nothing, "align.loss_type", "ipo"},
      {"rloo", [](auto& c, auto&) { c.dynamic_sampling = true; }, "align.dynamic_sampling"},
      {"ppo", [](auto& c, auto&) { c.scale_rewards = "batch"; }, "align.scale_rewards"},
      {"ppo", [](auto& c, auto&) { c.loss.gamma = 1.5; }, "align.gamma"},
      {"ppo", [](auto& c, auto&) { c.loss.lam = -0.1; }, "align.lam"},
      {"ppo", [](auto& c, auto&) { c.loss.cliprange_value = 0; }, "align.cliprange_value"},
      {"ppo", [](auto& c, auto&) { c.loss.vf_coef = -1; }, "align.vf_coef"},
      {"grpo", [](auto& c, auto&) { c.kv_cache_mb = -1; }, "align.kv_cache_mb"},
      {"grpo", [](auto& c, auto&) { c.value_model = "rm"; }, "align.value_model"},
      {"ppo", [](auto& c, auto&) { c.critic_lr = 1e-5; }, "align.critic_lr"},  // no critic
      {"ppo",
       [](auto& c, auto&) {
         c.value_model = "rm";
         c.critic_lr = -1;
       },
       "align.critic_lr"},
  };
  for (const Bad& b : bad) {
    OnlineRlConfig c;
    RejectionSamplingOptions s;
    s.num_rollouts = 4;
    s.max_tokens = 8;
    b.set(c, s);
    try {
      c.check(b.method, b.loss_type, s, 8, 24, 8);
      ADD_FAILURE() << b.key << " was not refused";
    } catch (const Error& e) {
      EXPECT_TRUE(test::contains(e.what(), b.key)) << b.key << ": " << e.what();
    }
  }
  OnlineRlConfig c;
  RejectionSamplingOptions s;
  s.num_rollouts = 1;
  s.max_tokens = 8;
  c.check("ppo", "sigmoid", s, 8, 24, 8);         // one generation per prompt
  EXPECT_EQ(c.loss.loss_type, RlLossType::Dapo);  // TRL PPO's token-level mean
  EXPECT_EQ(c.rollout_prompts, 8);
}

}  // namespace
}  // namespace nk

namespace nk {
namespace {

// PPO's value head is a parameter of the policy's checkpoints but not of
// the model it exports or quantises: no HF tensor maps to it and a
// whole-model quantisation plan leaves it (and only it, of the matrices)
// dense; its config round-trips through config.json.
TEST(ValueHead, InTheLayoutNotInExportsOrQuantisation) {
  ModelConfig c = test::tiny_config(true, 257, 32);
  c.d_ff = 64;  // rows of q8_0 blocks
  c.value_head = true;
  const ParamLayout layout = model_layout(c);
  ASSERT_TRUE(layout.has("value_head.weight"));
  EXPECT_EQ(layout.find("value_head.weight").shape, (std::vector<int64_t>{1, c.d_model}));
  EXPECT_TRUE(layout.has("value_head.bias"));
  for (const ExternalTensor& e : hf_model_tensors(c, "model."))
    EXPECT_FALSE(e.param.starts_with("value_head.")) << e.name;
  const QuantPlan plan = quant_plan_for(c, ops::QuantType::Q8_0);
  EXPECT_FALSE(plan.count("value_head.weight"));
  EXPECT_TRUE(plan.count("h.0.attn.qkv.weight"));
  EXPECT_TRUE(model_config_from_json(model_config_to_json(c), "config.json").value_head);
  c.value_head = false;
  EXPECT_FALSE(model_config_from_json(model_config_to_json(c), "config.json").value_head);
}

}  // namespace
}  // namespace nk
