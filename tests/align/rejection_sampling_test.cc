// Rejection sampling's parts without a reward model: prompts and (prompt,
// completion) pairs render exactly as preference training renders them; the
// selection keeps the best (top_n, threshold); scoring with a scorer whose
// rewards are known picks the sample it should; the batched samples are the
// same for a seed whatever the batch, and differ with it; the written file is
// read back by finetune's reader, with nothing written when nothing is kept.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "align/preference_data.h"
#include "align/prompt_records.h"
#include "align/rejection_sampling.h"
#include "data/chat/sft_data.h"
#include "data/utf8.h"
#include "infer/generate.h"
#include "infer/model_source.h"
#include "serve/serve_test_util.h"
#include "test_util.h"

namespace nk {
namespace {

using json = nlohmann::json;
using test::contains;
using test::error_of;

struct Fixture {
  test::TempDir dir{"nk_rs"};
  std::unique_ptr<Tokenizer> tok = load_tokenizer("bytes");
  const ChatTemplate& tmpl = find_chat_template("chatml");
  ChatSpecials specials{"", tok->token_bytes(tok->eod_id())};
  PreferenceRenderer r{*tok, tmpl, specials};
  PreferenceData read(const std::string& text) {
    test::write_file(dir / "p.jsonl", text);
    PreferenceDataOptions o;
    o.max_length = 256;
    return read_preference_jsonl(dir / "p.jsonl", *tok, tmpl, specials, o);
  }
};

TEST(RejectionSampling, RendersAsPreferenceTrainingDoes) {
  Fixture f;
  const json text = json::parse(R"({"prompt": "Q: hi", "chosen": " yes", "rejected": " no"})");
  const json chat = json::parse(
      R"({"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
          "chosen": [{"role": "assistant", "content": "yes"}],
          "rejected": [{"role": "assistant", "content": "no"}]})");
  const PreferenceData d = f.read(text.dump() + "\n" + chat.dump() + "\n");
  for (size_t e = 0; e < 2; ++e) {
    const json& rec = e ? chat : text;
    int64_t plen = 0;
    EXPECT_EQ(render_sequence(rec["prompt"], rec["chosen"], f.r, "x", &plen), d.tokens[2 * e]);
    EXPECT_EQ(render_sequence(rec["prompt"], rec["rejected"], f.r, "x"), d.tokens[2 * e + 1]);
    const std::vector<int32_t> p = render_prompt(rec["prompt"], f.r, "x");
    EXPECT_EQ(int64_t(p.size()), plen);
    EXPECT_TRUE(std::equal(p.begin(), p.end(), d.tokens[2 * e].begin()));
    // The first token the loss covers is the first after the prompt.
    EXPECT_FALSE(d.trained[2 * e][size_t(plen) - 1]);
    EXPECT_TRUE(d.trained[2 * e][size_t(plen)]);
  }
  // A sampled string completion of a chat prompt is one assistant message.
  EXPECT_EQ(render_sequence(chat["prompt"], "yes", f.r, "x"), d.tokens[2]);
  std::string rendered;
  for (int32_t t : render_prompt(chat["prompt"], f.r, "x")) rendered += f.tok->token_bytes(t);
  EXPECT_EQ(rendered,
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(RejectionSampling, RenderErrorsNameWhere) {
  Fixture f;
  EXPECT_TRUE(contains(error_of([&] { render_prompt(json(3), f.r, "f.jsonl:4: prompt"); }),
                       "f.jsonl:4: prompt: must be a string or a list of messages"));
  EXPECT_TRUE(contains(error_of([&] { render_prompt(json(""), f.r, "f.jsonl:2: prompt"); }),
                       "f.jsonl:2: prompt: the prompt is empty"));
  const json ends_with_assistant = json::parse(R"([{"role": "assistant", "content": "x"}])");
  EXPECT_TRUE(
      contains(error_of([&] { render_prompt(ends_with_assistant, f.r, "f.jsonl:7: prompt"); }),
               "f.jsonl:7: prompt[0]: the prompt ends with a 'assistant' message"));
  EXPECT_TRUE(
      contains(error_of([&] { render_sequence(json("q"), json(""), f.r, "f.jsonl:1: prompt"); }),
               "the completion is empty"));
  const json bad_role = json::parse(R"([{"role": "robot", "content": "x"}])");
  EXPECT_TRUE(contains(error_of([&] { render_prompt(bad_role, f.r, "f.jsonl:9: prompt"); }),
                       "f.jsonl:9: prompt[0]: role 'robot'"));
}

TEST(RejectionSampling, SelectionKeepsTheBestAboveTheThreshold) {
  const std::vector<std::optional<float>> r = {0.5f, std::nullopt, 2.f, -1.f, 2.f};
  const double off = -INFINITY;
  EXPECT_EQ(select_rollouts(r, 1, off), (std::vector<int64_t>{2}));  // ties: the earlier
  EXPECT_EQ(select_rollouts(r, 3, off), (std::vector<int64_t>{2, 4, 0}));
  EXPECT_EQ(select_rollouts(r, 9, off), (std::vector<int64_t>{2, 4, 0, 3}));
  EXPECT_EQ(select_rollouts(r, 9, 0.5), (std::vector<int64_t>{2, 4, 0}));
  EXPECT_TRUE(select_rollouts(r, 9, 3.0).empty());
}

TEST(RejectionSampling, OptionsOutOfRangeNameTheirKey) {
  auto err = [](auto set) {
    RejectionSamplingOptions o;
    set(o);
    return error_of([&] { o.check(); });
  };
  EXPECT_TRUE(contains(err([](auto& o) { o.num_rollouts = 0; }),
                       "align.num_rollouts_per_prompt: must be >= 1, got 0"));
  EXPECT_TRUE(contains(err([](auto& o) { o.top_n = 5; }), "align.top_n_rollouts: 5 is more"));
  EXPECT_TRUE(contains(err([](auto& o) { o.max_tokens = 0; }), "align.max_tokens"));
  EXPECT_TRUE(contains(err([](auto& o) { o.sampling.top_p = 2; }), "align.top_p"));
}

// Reward: how many 'Z' bytes the whole sequence holds.
std::vector<float> count_z(const std::vector<std::vector<int32_t>>& seqs) {
  std::vector<float> r;
  for (const auto& s : seqs) r.push_back(float(std::count(s.begin(), s.end(), int32_t('Z'))));
  return r;
}

std::vector<PromptRollouts> two_prompts() {
  std::vector<PromptRollouts> v(2);
  v[0].line = 1;
  v[0].prompt = "Z?";  // the prompt's own Z counts in every sample alike
  v[0].samples = {"ab", "ZZa", "", "Zb"};
  v[1].line = 3;
  v[1].prompt = json::parse(R"([{"role": "user", "content": "hi"}])");
  v[1].samples = {"Z", "no", "ZZZ", "ZZ"};
  return v;
}

TEST(RejectionSampling, ScoringPicksTheHighestRewardedSample) {
  Fixture f;
  std::vector<PromptRollouts> v = two_prompts();
  score_rollouts(v, f.r, count_z, 1, -INFINITY, [](size_t i) { return fmt::format("p{}", i); });
  EXPECT_EQ(v[0].kept, (std::vector<int64_t>{1}));
  EXPECT_EQ(v[1].kept, (std::vector<int64_t>{2}));
  EXPECT_FALSE(v[0].rewards[2].has_value());  // empty: not scored
  EXPECT_FLOAT_EQ(*v[0].rewards[1], 3.f);
  EXPECT_DOUBLE_EQ(v[0].max, 3.0);
  EXPECT_DOUBLE_EQ(v[0].mean, (1.0 + 3.0 + 2.0) / 3.0);
  EXPECT_DOUBLE_EQ(v[1].mean, (1.0 + 0 + 3.0 + 2.0) / 4.0);
  // A sequence longer than the reward model's context: an error naming the prompt.
  std::vector<PromptRollouts> w = two_prompts();
  EXPECT_TRUE(contains(test::error_of([&] {
                         score_rollouts(
                             w, f.r, count_z, 1, -INFINITY,
                             [](size_t i) { return fmt::format("f:{}: prompt", i); }, 4);
                       }),
                       "f:0: prompt: sample 0 with its prompt is 5 tokens for the reward model, "
                       "more than its context of 4"));
  const RejectionSamplingSummary s = summarize(v);
  EXPECT_EQ(s.samples, 8);
  EXPECT_EQ(s.scored, 7);
  EXPECT_EQ(s.kept, 2);
  EXPECT_DOUBLE_EQ(s.mean_max_reward, 3.0);
}

TEST(RejectionSampling, WrittenFileIsFinetunesInput) {
  Fixture f;
  std::vector<PromptRollouts> v = two_prompts();
  score_rollouts(v, f.r, count_z, 2, -INFINITY, [](size_t i) { return fmt::format("p{}", i); });
  const std::string out = f.dir / "sub/rs.jsonl";
  const json settings = {{"seed", 1}};
  write_rejection_sampling(out, "align.output_path", v, settings);
  EXPECT_TRUE(rejection_sampling_done(out, settings));
  EXPECT_FALSE(rejection_sampling_done(out, json{{"seed", 2}}));
  const std::vector<std::string> lines = [&] {
    std::vector<std::string> l;
    std::istringstream in(test::read_file(out));
    for (std::string s; std::getline(in, s);) l.push_back(s);
    return l;
  }();
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(json::parse(lines[0]),
            json::parse(R"({"input": "Z?", "output": "ZZa", "reward": 3.0})"));
  EXPECT_EQ(json::parse(lines[2])["messages"], json::parse(R"([{"role": "user", "content": "hi"},
                            {"role": "assistant", "content": "ZZZ"}])"));
  // finetune's reader: the string prompts with no markup, as they were sampled and scored.
  const SftData plain = read_sft_jsonl(out, find_chat_template("plain"), f.specials, *f.tok, {});
  ASSERT_EQ(plain.tokens.size(), 4u);
  EXPECT_EQ(plain.tokens[0], render_sequence(v[0].prompt, "ZZa", f.r, "x"));
  const SftData chat = read_sft_jsonl(out, f.tmpl, f.specials, *f.tok, {});
  EXPECT_EQ(chat.tokens[2], render_sequence(v[1].prompt, "ZZZ", f.r, "x"));
  // The stats: settings, then one line per prompt.
  std::istringstream stats(test::read_file(rejection_stats_path(out)));
  std::string first, second;
  std::getline(stats, first);
  std::getline(stats, second);
  EXPECT_EQ(json::parse(first)["settings"], settings);
  const json s = json::parse(second);
  EXPECT_EQ(s["line"], 1);
  EXPECT_EQ(s["kept"], json::parse("[1, 3]"));
  EXPECT_EQ(s["rewards"], json::parse("[1.0, 3.0, null, 2.0]"));
  EXPECT_EQ(s["max"], 3.0);

  // Nothing kept (all under the threshold): an error, and nothing written.
  std::vector<PromptRollouts> w = two_prompts();
  score_rollouts(w, f.r, count_z, 1, 10.0, [](size_t i) { return fmt::format("p{}", i); });
  const std::string none = f.dir / "none.jsonl";
  EXPECT_TRUE(
      contains(error_of([&] { write_rejection_sampling(none, "align.output_path", w, settings); }),
               "align.output_path: no sample kept"));
  EXPECT_FALSE(std::filesystem::exists(none));
  EXPECT_FALSE(std::filesystem::exists(rejection_stats_path(none)));
}

TEST(RejectionSampling, SamplesAreDeterministicForASeedWhateverTheBatch) {
  Fixture f;
  const std::string model_dir = f.dir / "model";
  test::save_ascii_model(model_dir, 256);
  ModelSourceKeys k;
  k.prefix = "t";
  k.model = model_dir;
  RunnableModel m = load_runnable_model(k);
  const std::vector<std::vector<int32_t>> prompts = {render_prompt("say a", f.r, "p0"),
                                                     render_prompt("say bb", f.r, "p1"),
                                                     render_prompt("c", f.r, "p2")};
  RejectionSamplingOptions o;
  o.num_rollouts = 3;
  o.max_tokens = 6;
  o.sampling.seed = 7;
  o.batch = 8;
  const auto a = generate_rollouts(*m.model, *m.tokenizer, {}, prompts, o);
  o.batch = 1;
  const auto b = generate_rollouts(*m.model, *m.tokenizer, {}, prompts, o);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(a[0].size(), 3u);
  EXPECT_NE(a[0][0], a[0][1]);  // each sample its own stream
  o.sampling.seed = 8;
  const auto c = generate_rollouts(*m.model, *m.tokenizer, {}, prompts, o);
  EXPECT_NE(a, c);
  // Sample j of prompt i draws from seed + i * n + j: seed 8's first sample is seed 7's second.
  EXPECT_EQ(c[0][0], a[0][1]);
  // A chunk starting at prompt 1 draws what the whole run drew for it.
  o.sampling.seed = 7;
  const std::vector<std::vector<int32_t>> tail(prompts.begin() + 1, prompts.end());
  const auto d = generate_rollouts(*m.model, *m.tokenizer, {}, tail, o, 1);
  EXPECT_EQ(d, std::vector<std::vector<std::string>>(a.begin() + 1, a.end()));
}

// A random model over bytes samples bytes that are no UTF-8; JSONL holds
// UTF-8, so samples keep U+FFFD there (before: "internal error: invalid UTF-8
// byte" from the JSON writer once every sample was drawn).
TEST(RejectionSampling, SamplesAreValidUtf8) {
  Fixture f;
  ModelConfig c;
  c.arch = "llama";
  c.vocab_size = 257;
  c.max_seq_len = 64;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_kv_head = 2;
  c.d_model = 16;
  c.d_ff = 32;
  Transformer m(c, DType::F32, 3);
  const std::vector<std::vector<int32_t>> prompts = {render_prompt("x", f.r, "p")};
  RejectionSamplingOptions o;
  o.num_rollouts = 8;
  o.max_tokens = 16;
  // The raw samples of this model are not all UTF-8 ...
  Generator gen(m, f.tok.get(), 8);
  std::vector<GenerationRequest> reqs(8);
  for (size_t j = 0; j < reqs.size(); ++j) {
    reqs[j].prompt = prompts[0];
    reqs[j].max_new_tokens = o.max_tokens;
    reqs[j].sampling.seed = j;
  }
  bool invalid = false;
  for (const GenerationResult& r : gen.run(reqs)) invalid |= find_invalid_utf8(r.text) >= 0;
  ASSERT_TRUE(invalid) << "the test needs a model that samples invalid UTF-8";
  // ... the rollouts are, and are written.
  std::vector<PromptRollouts> v(1);
  v[0].prompt = "x";
  v[0].samples = generate_rollouts(m, *f.tok, {}, prompts, o)[0];
  for (const std::string& s : v[0].samples) EXPECT_EQ(find_invalid_utf8(s), -1) << s;
  score_rollouts(v, f.r, count_z, 8, -INFINITY, [](size_t) { return std::string("p"); });
  write_rejection_sampling(f.dir / "u.jsonl", "k", v, json{{"seed", 0}});
  EXPECT_EQ(read_sft_jsonl(f.dir / "u.jsonl", find_chat_template("plain"), f.specials, *f.tok, {})
                .tokens.size(),
            v[0].kept.size());
}

TEST(RejectionSampling, ProgressIsReadBackUpToTheLastWholeLine) {
  Fixture f;
  std::vector<PromptRollouts> v = two_prompts();
  score_rollouts(v, f.r, count_z, 1, -INFINITY, [](size_t i) { return fmt::format("p{}", i); });
  const std::string out = f.dir / "rs.jsonl";
  const json settings = {{"seed", 1}};
  EXPECT_TRUE(read_rejection_progress(out, settings, 9).empty());  // no file
  append_rejection_progress(out, settings, true, {v[0]});
  append_rejection_progress(out, settings, false, {v[1]});
  std::vector<PromptRollouts> back = read_rejection_progress(out, settings, 9);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].samples, v[1].samples);
  EXPECT_EQ(back[0].rewards, v[0].rewards);  // the empty sample's nullopt too
  settle_rollouts(back[1], 1, -INFINITY);
  EXPECT_EQ(back[1].kept, v[1].kept);
  EXPECT_EQ(read_rejection_progress(out, settings, 1).size(), 1u);
  EXPECT_TRUE(read_rejection_progress(out, json{{"seed", 2}}, 9).empty());
  // A line cut by a kill: the prompts from it on are redone.
  const std::string text = test::read_file(rejection_progress_path(out));
  test::write_file(rejection_progress_path(out), text.substr(0, text.size() - 7));
  EXPECT_EQ(read_rejection_progress(out, settings, 9).size(), 1u);
  // The final write removes the progress.
  write_rejection_sampling(out, "k", v, settings);
  EXPECT_FALSE(std::filesystem::exists(rejection_progress_path(out)));
}

TEST(RejectionSampling, PromptRecordsNameTheirLines) {
  Fixture f;
  test::write_file(f.dir / "empty.jsonl", "\n  \n");
  EXPECT_TRUE(contains(error_of([&] { read_json_records(f.dir / "empty.jsonl"); }),
                       "empty.jsonl: no record"));
  test::write_file(f.dir / "bad.jsonl", "{\"prompt\": \"a\"}\n[1]\n");
  EXPECT_TRUE(contains(error_of([&] { read_json_records(f.dir / "bad.jsonl"); }),
                       "bad.jsonl:2: a record must be a JSON object"));
  test::write_file(f.dir / "ok.jsonl", "\n{\"text\": \"a\"}\n");
  const JsonRecords r = read_json_records(f.dir / "ok.jsonl");
  EXPECT_TRUE(contains(error_of([&] { record_field(r, r.records[0], "prompt"); }),
                       "ok.jsonl:2: no \"prompt\""));
}

}  // namespace
}  // namespace nk
