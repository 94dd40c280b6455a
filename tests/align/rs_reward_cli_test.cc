// Rejection sampling and SteerLM with real sequence classifiers (tiny random
// ones made here): the kept sample is the one its reward model scores
// highest, as the model scores it in this process; a run is the same bytes
// for a seed and reused on a rerun; chat prompts write finetune's messages
// and the SFT pass trains on them; a causal LM as the reward model is refused
// before anything is written; SteerLM fills missing values from an attribute
// model's rounded, clipped scores.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "align/reward_scoring.h"
#include "align/steerlm.h"
#include "core/rng.h"
#include "serve/serve_test_util.h"
#include "test_paths.h"
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

// A random GPT-2 sequence classifier over bytes with `labels`.
void save_classifier(const std::string& dir, const std::vector<std::string>& labels,
                     uint64_t seed) {
  ModelConfig c;
  c.arch = "gpt2";
  c.vocab_size = 257;
  c.max_seq_len = 256;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_kv_head = 2;
  c.d_model = 32;
  c.d_ff = 64;
  c.tied_embeddings = false;
  c.init_std = 0.5;
  c.num_labels = int64_t(labels.size());
  c.labels = labels;
  Transformer m(c, DType::F32, seed);
  save_model(dir, m);
  store_tokenizer("bytes", dir);
  test::write_file(dir + "/tokenizer_config.json",
                   json{{"chat_template", find_chat_template("chatml").jinja()}}.dump());
}

struct RsRun {
  TempDir dir{"nk_rs_cli"};
  std::string policy = dir / "policy", rm = dir / "rm";
  RsRun() {
    test::save_ascii_model(policy, 256);
    save_classifier(rm, {"reward"}, 5);
  }
  std::string args(const std::string& data, const std::string& out, const std::string& extra) {
    return "align align.method=rs train.init_from=" + policy + " align.reward_model=" + rm +
           " align.data_path=" + (dir / data) + " train.out_dir=" + out +
           " align.num_rollouts_per_prompt=4 align.max_tokens=8 align.seed=3 train.dtype=f32 " +
           extra;
  }
};

TEST(RsRewardCli, KeepsTheHighestScoredSampleDeterministically) {
  RsRun t;
  test::write_file(t.dir / "prompts.jsonl",
                   "{\"prompt\": \"say a\"}\n\n{\"prompt\": \"say bb\"}\n{\"prompt\": \"c\"}\n");
  const std::string out = t.dir / "run";
  const test::RunResult r = test::run_nekton(t.args("prompts.jsonl", out, ""));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string sft = out + "/rs_sft.jsonl";
  const std::vector<json> kept = read_jsonl(sft), stats = read_jsonl(sft + ".stats.jsonl");
  ASSERT_EQ(kept.size(), 3u);
  ASSERT_EQ(stats.size(), 4u);  // the settings, then one line per prompt
  EXPECT_EQ(stats[2]["line"], 3);
  // The reward model, loaded here, scores each (prompt, sample) as the run did.
  const RewardScorer rm("rm", t.rm, "auto", t.policy, "f32", kHost, 4);
  for (size_t i = 0; i < 3; ++i) {
    const json& s = stats[i + 1];
    const std::string prompt = kept[i]["input"];
    std::vector<std::vector<int32_t>> seqs;
    for (const auto& x : s["samples"])
      seqs.push_back(render_sequence(prompt, x, rm.renderer(), "t"));
    const std::vector<std::vector<float>> scores = rm.score(seqs);
    size_t best = 0;
    for (size_t j = 0; j < scores.size(); ++j) {
      EXPECT_NEAR(scores[j][0], s["rewards"][j].get<double>(), 1e-5);
      if (scores[j][0] > scores[best][0]) best = j;
    }
    EXPECT_EQ(s["kept"], json::array({best}));
    EXPECT_EQ(kept[i]["output"], s["samples"][best]);
    EXPECT_NEAR(kept[i]["reward"].get<double>(), scores[best][0], 1e-5);
    EXPECT_NEAR(s["max"].get<double>(), scores[best][0], 1e-5);
  }
  // The same seed elsewhere: the same bytes. A rerun here reuses the files.
  const test::RunResult again = test::run_nekton(t.args("prompts.jsonl", t.dir / "again", ""));
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_EQ(test::read_file(t.dir / "again/rs_sft.jsonl"), test::read_file(sft));
  const auto written = fs::last_write_time(sft);
  const test::RunResult reuse = test::run_nekton(t.args("prompts.jsonl", out, ""));
  ASSERT_EQ(reuse.code, 0) << reuse.out;
  EXPECT_TRUE(contains(reuse.out, "reusing")) << reuse.out;
  EXPECT_EQ(fs::last_write_time(sft), written);
  // Another seed: other samples, written over the old ones.
  const test::RunResult other = test::run_nekton(t.args("prompts.jsonl", out, "align.seed=4"));
  ASSERT_EQ(other.code, 0) << other.out;
  EXPECT_NE(read_jsonl(sft + ".stats.jsonl")[1]["samples"], stats[1]["samples"]);
}

TEST(RsRewardCli, AKilledRunResumesToTheSameFile) {
  RsRun t;
  std::string prompts;
  for (int i = 0; i < 40; ++i) prompts += fmt::format("{{\"prompt\": \"say {}\"}}\n", i);
  test::write_file(t.dir / "prompts.jsonl", prompts);
  const std::string extra = "align.max_tokens=24 align.progress_every=1";
  const test::RunResult whole = test::run_nekton(t.args("prompts.jsonl", t.dir / "whole", extra));
  ASSERT_EQ(whole.code, 0) << whole.out;
  const std::string out = t.dir / "cut";
  std::vector<std::string> args;
  {
    std::istringstream in(t.args("prompts.jsonl", out, extra));
    for (std::string s; in >> s;) args.push_back(s);
  }
  const pid_t pid = test::spawn_nekton(args, t.dir / "cut.log");
  ASSERT_GT(pid, 0);
  const std::string partial = out + "/rs_sft.jsonl.partial.jsonl";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  auto lines = [&] {
    const std::string s = fs::exists(partial) ? test::read_file(partial) : "";
    return std::count(s.begin(), s.end(), '\n');
  };
  while (lines() < 4 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  ASSERT_FALSE(fs::exists(out + "/rs_sft.jsonl")) << "the run ended before the kill";
  const test::RunResult again = test::run_nekton(t.args("prompts.jsonl", out, extra));
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_TRUE(contains(again.out, "resuming after")) << again.out;
  EXPECT_EQ(test::read_file(out + "/rs_sft.jsonl"), test::read_file(t.dir / "whole/rs_sft.jsonl"));
  EXPECT_EQ(test::read_file(out + "/rs_sft.jsonl.stats.jsonl"),
            test::read_file(t.dir / "whole/rs_sft.jsonl.stats.jsonl"));
  EXPECT_FALSE(fs::exists(partial));
}

TEST(RsRewardCli, ChatPromptsWriteMessagesAndTheSftPassTrains) {
  RsRun t;
  test::write_file(
      t.dir / "chat.jsonl",
      R"({"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]})"
      "\n"
      R"({"prompt": [{"role": "user", "content": "name a colour"}]})"
      "\n");
  const std::string out = t.dir / "run";
  const test::RunResult r = test::run_nekton(
      t.args("chat.jsonl", out,
             "align.top_n_rollouts=2 align.rs_sft=true train.steps=2 train.seq_len=128 "
             "train.micro_batch=2 train.global_batch=2 train.threads=2"));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<json> kept = read_jsonl(out + "/rs_sft.jsonl");
  ASSERT_EQ(kept.size(), 4u);
  EXPECT_EQ(kept[0]["messages"].size(), 3u);
  EXPECT_EQ(kept[0]["messages"][2]["role"], "assistant");
  EXPECT_GE(kept[0]["reward"].get<double>(), kept[1]["reward"].get<double>());  // best first
  EXPECT_TRUE(contains(r.out, "fine-tuning on")) << r.out;
  EXPECT_TRUE(fs::exists(out + "/model/model.safetensors")) << r.out;
  EXPECT_EQ(test::logged_losses(out + "/metrics.jsonl").size(), 2u);
}

TEST(RsRewardCli, ACausalLmIsNoRewardModel) {
  RsRun t;
  test::write_file(t.dir / "p.jsonl", "{\"prompt\": \"a\"}\n");
  const std::string out = t.dir / "run";
  const test::RunResult r = test::run_nekton(
      "align align.method=rs train.init_from=" + t.policy + " align.reward_model=" + t.policy +
      " align.data_path=" + (t.dir / "p.jsonl") + " train.out_dir=" + out);
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.out, "align.reward_model '" + t.policy + "': a causal LM (num_labels 0)"))
      << r.out;
  EXPECT_FALSE(fs::exists(out));
  // Several labels: no single reward to rank by.
  save_classifier(t.dir / "attr", {"a", "b"}, 6);
  const test::RunResult two =
      test::run_nekton("align align.method=rs train.init_from=" + t.policy +
                       " align.reward_model=" + (t.dir / "attr") +
                       " align.data_path=" + (t.dir / "p.jsonl") + " train.out_dir=" + out);
  EXPECT_NE(two.code, 0);
  EXPECT_TRUE(contains(two.out, "2 labels (a, b)")) << two.out;
  EXPECT_FALSE(fs::exists(out));
}

TEST(SteerLmRewardCli, AttributeModelFillsMissingValues) {
  TempDir dir("nk_steerlm_fill");
  const std::string policy = dir / "policy", attr = dir / "attr";
  test::save_ascii_model(policy, 256);
  // Labels in another order than the attributes, and one more.
  save_classifier(
      attr, {"verbosity", "humor", "helpfulness", "correctness", "coherence", "complexity"}, 7);
  test::write_file(
      dir / "data.jsonl",
      R"({"prompt": "say a", "response": " aaa"})"
      "\n"
      R"({"prompt": [{"role": "user", "content": "hi"}], "response": "hello", "helpfulness": 2})"
      "\n");
  // A file holds one kind of prompt.
  const std::string out = dir / "run";
  const test::RunResult mixed = test::run_nekton(
      "align align.method=steerlm train.init_from=" + policy + " align.attribute_model=" + attr +
      " align.data_path=" + (dir / "data.jsonl") + " train.out_dir=" + out);
  EXPECT_NE(mixed.code, 0);
  EXPECT_TRUE(contains(mixed.out, "data.jsonl:2: prompt: a chat prompt where")) << mixed.out;
  test::write_file(dir / "data.jsonl",
                   R"({"prompt": "say a", "response": " aaa"})"
                   "\n"
                   R"({"prompt": "hi", "response": "hello", "label": "helpfulness:2"})"
                   "\n");
  const test::RunResult r = test::run_nekton(
      "align align.method=steerlm train.init_from=" + policy + " align.attribute_model=" + attr +
      " align.data_path=" + (dir / "data.jsonl") + " train.out_dir=" + out +
      " align.steerlm_sft=false align.steerlm_attributes=" +
      "helpfulness,correctness,coherence,complexity,verbosity");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "2 records (2 with values from the attribute model)")) << r.out;
  const std::vector<json> sft = read_jsonl(out + "/steerlm_sft.jsonl");
  ASSERT_EQ(sft.size(), 2u);
  const RewardScorer am("am", attr, "auto", policy, "f32", kHost, 4);
  SteerLmSpec spec;
  spec.names = helpsteer_attributes();
  const std::vector<size_t> label_of = {2, 3, 4, 5, 0};
  for (size_t i = 0; i < 2; ++i) {
    const std::string prompt = i ? "hi" : "say a", response = i ? "hello" : " aaa";
    const std::vector<float> s =
        am.score({render_sequence(prompt, response, am.renderer(), "t")})[0];
    std::vector<int64_t> v;
    for (size_t k = 0; k < 5; ++k) v.push_back(attribute_value(spec, s[label_of[k]]));
    if (i == 1) v[0] = 2;  // the record's own value stays
    EXPECT_EQ(sft[i]["label"], attribute_string(spec, v));
    EXPECT_EQ(sft[i]["input"], attribute_string(spec, v) + "\n" + prompt);
  }
  EXPECT_FALSE(fs::exists(out + "/model"));  // steerlm_sft=false: data only
  // An attribute the model has no label for.
  const test::RunResult unknown = test::run_nekton(
      "align align.method=steerlm train.init_from=" + policy + " align.attribute_model=" + attr +
      " align.data_path=" + (dir / "data.jsonl") + " train.out_dir=" + (dir / "run2") +
      " align.steerlm_attributes=helpfulness,toxicity");
  EXPECT_NE(unknown.code, 0);
  EXPECT_TRUE(contains(
      unknown.out, "align.steerlm_attributes: 'toxicity' is not a label of align.attribute_model"))
      << unknown.out;
  EXPECT_FALSE(fs::exists(dir / "run2"));
}

}  // namespace
}  // namespace nk

namespace nk {
namespace {

// configs/align_rs.yaml and configs/align_steerlm.yaml run as written,
// shrunk to the tests' models and two steps.
TEST(RsRewardCli, RecipesRun) {
  RsRun t;
  test::write_file(t.dir / "prompts.jsonl", "{\"prompt\": \"say a\"}\n{\"prompt\": \"say b\"}\n");
  test::write_file(
      t.dir / "steer.jsonl",
      R"({"prompt": "say a", "response": " aaa", "label": "helpfulness:4,correctness:3,coherence:4,complexity:1,verbosity:0"})"
      "\n"
      R"({"prompt": "say b", "response": " bbb", "label": "helpfulness:1,correctness:0,coherence:2,complexity:1,verbosity:4"})"
      "\n");
  const std::string shrink =
      " train.seq_len=128 train.micro_batch=2 train.global_batch=2 train.steps=2 "
      "train.warmup_steps=0 train.peak_tflops=1 train.threads=2";
  const std::string rs = t.dir / "rs", steer = t.dir / "steer";
  const test::RunResult r = test::run_nekton(
      "align --config " + std::string(NK_SOURCE_DIR) + "/configs/align_rs.yaml train.init_from=" +
      t.policy + " align.reward_model=" + t.rm + " align.data_path=" + (t.dir / "prompts.jsonl") +
      " align.max_tokens=8 align.rs_sft=true train.out_dir=" + rs + shrink);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(read_jsonl(rs + "/rs_sft.jsonl").size(), 2u);
  EXPECT_EQ(test::logged_losses(rs + "/metrics.jsonl").size(), 2u) << r.out;
  const test::RunResult s = test::run_nekton(
      "align --config " + std::string(NK_SOURCE_DIR) +
      "/configs/align_steerlm.yaml train.init_from=" + t.policy +
      " align.data_path=" + (t.dir / "steer.jsonl") + " train.out_dir=" + steer + shrink);
  ASSERT_EQ(s.code, 0) << s.out;
  EXPECT_EQ(test::logged_losses(steer + "/metrics.jsonl").size(), 2u) << s.out;
  EXPECT_TRUE(fs::exists(steer + "/model/steerlm.json"));
}

}  // namespace
}  // namespace nk

namespace nk {
namespace {

// The whole pipeline on a marker: a reward model trained (align.method=rm)
// to prefer the answer " END" to three random letters, a policy fine-tuned to
// answer " END" about 30% of the time; best-of-8 then keeps an " END" sample
// for every prompt that drew one.
TEST(RsRewardCli, ATrainedRewardModelKeepsTheMarker) {
  TempDir dir("nk_rs_marker");
  const std::string base = dir / "base";
  test::save_ascii_model(base, 256);
  Rng rng(1);
  auto letters = [&](int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += char('a' + rng.below(26));
    return s;
  };
  std::string pairs, sft, prompts;
  for (int i = 0; i < 256; ++i) {
    const std::string p = letters(3), r = letters(3);
    pairs += fmt::format(R"({{"prompt": "say {}:", "chosen": " END", "rejected": " {}"}})"
                         "\n",
                         p, r);
  }
  for (int i = 0; i < 512; ++i) {
    const std::string p = letters(3), r = letters(3);
    sft += fmt::format(R"({{"input": "say {}:", "output": " {}"}})"
                       "\n",
                       p, rng.below(10) < 3 ? std::string("END") : r);
  }
  for (int i = 0; i < 16; ++i) {
    const std::string p = letters(3);
    prompts += fmt::format(R"({{"prompt": "say {}:"}})"
                           "\n",
                           p);
  }
  test::write_file(dir / "pairs.jsonl", pairs);
  test::write_file(dir / "sft.jsonl", sft);
  test::write_file(dir / "prompts.jsonl", prompts);
  const std::string common =
      " train.dtype=f32 train.seq_len=16 train.micro_batch=16 train.global_batch=16 "
      "train.lr=3e-3 train.warmup_steps=0 train.threads=2 train.init_from=" +
      base;
  const test::RunResult rm =
      test::run_nekton("align align.method=rm align.data_path=" + (dir / "pairs.jsonl") +
                       " train.steps=60" + common + " train.out_dir=" + (dir / "rm"));
  ASSERT_EQ(rm.code, 0) << rm.out;
  const test::RunResult ft =
      test::run_nekton("finetune data.chat_template=plain data.sft_path=" + (dir / "sft.jsonl") +
                       " train.steps=150" + common + " train.out_dir=" + (dir / "policy"));
  ASSERT_EQ(ft.code, 0) << ft.out;
  const std::string out = dir / "rs";
  const test::RunResult r = test::run_nekton(
      "align align.method=rs train.init_from=" + (dir / "policy/model") +
      " align.reward_model=" + (dir / "rm/model") + " align.data_path=" + (dir / "prompts.jsonl") +
      " align.num_rollouts_per_prompt=8 align.max_tokens=6 align.seed=1 train.dtype=f32 "
      "train.out_dir=" +
      out);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<json> stats = read_jsonl(out + "/rs_sft.jsonl.stats.jsonl");
  ASSERT_EQ(stats.size(), 17u);
  int drew = 0, kept = 0, samples = 0, marked = 0;
  for (size_t i = 1; i < stats.size(); ++i) {
    bool any = false;
    for (const auto& s : stats[i]["samples"]) {
      const bool m = contains(s.get<std::string>(), "END");
      any |= m;
      marked += m;
      ++samples;
    }
    drew += any;
    const std::string best = stats[i]["samples"][stats[i]["kept"][0].get<size_t>()];
    kept += contains(best, "END");
    if (any) {
      EXPECT_TRUE(contains(best, "END")) << stats[i].dump();
    }
  }
  EXPECT_GE(drew, 8) << "the policy should draw the marker often";
  EXPECT_LT(marked, samples) << "and not always";
  EXPECT_EQ(kept, drew);
}

}  // namespace
}  // namespace nk
