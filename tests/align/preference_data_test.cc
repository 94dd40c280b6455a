// Preference JSONL: the standard, conversational (explicit and implicit
// prompt) and unpaired forms as sequences whose loss covers the completion
// alone, the keep_end truncation and its count, and every kind of bad record
// as an error naming the file and line.
#include <gtest/gtest.h>

#include "align/preference_data.h"
#include "data/tokenizer/tokenizer.h"
#include "test_util.h"

namespace nk {
namespace {

using test::contains;
using test::error_of;

struct Fixture {
  test::TempDir dir{"nk_pref"};
  std::unique_ptr<Tokenizer> tok = load_tokenizer("bytes");
  const ChatTemplate& tmpl = find_chat_template("chatml");
  ChatSpecials specials{"", tok->token_bytes(tok->eod_id())};
  PreferenceData read(const std::string& text, PreferenceDataOptions o = {},
                      const std::string& name = "p.jsonl") {
    test::write_file(dir / name, text);
    if (o.max_length == 0) o.max_length = 64;
    return read_preference_jsonl(dir / name, *tok, tmpl, specials, o);
  }
  std::string error(const std::string& text, PreferenceDataOptions o = {}) {
    return error_of([&] { read(text, o); });
  }
  // The trained tokens of sequence s as text.
  std::string trained_text(const PreferenceData& d, size_t s) {
    std::string out;
    for (size_t i = 0; i < d.tokens[s].size(); ++i)
      if (d.trained[s][i]) out += tok->token_bytes(d.tokens[s][i]);
    return out;
  }
  std::string text(const PreferenceData& d, size_t s) {
    std::string out;
    for (int32_t t : d.tokens[s]) out += tok->token_bytes(t);
    return out;
  }
};

TEST(PreferenceData, StandardForm) {
  Fixture f;
  const PreferenceData d = f.read(R"({"prompt": "Q: hi", "chosen": " yes", "rejected": " no"})"
                                  "\n\n");
  ASSERT_EQ(d.examples(), 1);
  ASSERT_EQ(d.tokens.size(), 2u);
  const std::string eos = f.tok->token_bytes(f.tok->eod_id());
  EXPECT_EQ(f.text(d, 0), "Q: hi yes" + eos);
  EXPECT_EQ(f.trained_text(d, 0), " yes" + eos);
  EXPECT_EQ(f.trained_text(d, 1), " no" + eos);
  EXPECT_EQ(d.line[0], 1);
}

TEST(PreferenceData, ConversationalFormsRenderWithTheTemplate) {
  Fixture f;
  PreferenceDataOptions o;
  o.max_length = 256;
  const PreferenceData d = f.read(
      R"({"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "yes"}], "rejected": [{"role": "assistant", "content": "no"}]})"
      "\n"
      R"({"chosen": [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}], "rejected": [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "no"}]})"
      "\n",
      o);
  ASSERT_EQ(d.examples(), 2);
  EXPECT_EQ(f.text(d, 0), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyes<|im_end|>\n");
  EXPECT_EQ(f.trained_text(d, 0), "yes<|im_end|>");
  EXPECT_EQ(f.trained_text(d, 1), "no<|im_end|>");
  // The implicit prompt: the shared system and user messages.
  EXPECT_EQ(f.text(d, 2),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>"
            "assistant\nyes<|im_end|>\n");
  EXPECT_EQ(f.trained_text(d, 3), "no<|im_end|>");
}

TEST(PreferenceData, UnpairedFormPairsEachPromptWithThePreviousCompletion) {
  Fixture f;
  PreferenceDataOptions o;
  o.unpaired = true;
  o.kto_group = 2;
  const PreferenceData d = f.read(R"({"prompt": "a", "completion": "1", "label": true})"
                                  "\n"
                                  R"({"prompt": "b", "completion": "2", "label": false})"
                                  "\n"
                                  R"({"prompt": "c", "completion": "3", "label": true})"
                                  "\n",
                                  o);
  ASSERT_EQ(d.examples(), 3);
  const std::string eos = f.tok->token_bytes(f.tok->eod_id());
  EXPECT_EQ(d.desirable, (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(f.text(d, 0), "a1" + eos);
  EXPECT_EQ(f.text(d, 1), "a2" + eos);  // group [a, b]: a takes the group's last completion
  EXPECT_EQ(f.text(d, 3), "b1" + eos);
  EXPECT_EQ(f.text(d, 5), "c3" + eos);  // a group of one
}

TEST(PreferenceData, TruncationKeepsThePromptsEndThenCutsCompletions) {
  Fixture f;
  PreferenceDataOptions o;
  o.max_length = 12;
  o.max_prompt_length = 4;
  const PreferenceData d =
      f.read(R"({"prompt": "0123456789", "chosen": "abcdefghij", "rejected": "xy"})"
             "\n"
             R"({"prompt": "pq", "chosen": "ab", "rejected": "cd"})"
             "\n",
             o);
  EXPECT_EQ(d.truncated, 1);
  EXPECT_TRUE(contains(d.summary(), "1 of 2 truncated")) << d.summary();
  EXPECT_EQ(f.text(d, 0), "6789abcdefgh");  // the prompt's last 4, then 8 of the completion
  EXPECT_EQ(f.trained_text(d, 0), "abcdefgh");
  const std::string eos = f.tok->token_bytes(f.tok->eod_id());
  EXPECT_EQ(f.text(d, 1), "6789xy" + eos);
  EXPECT_EQ(f.text(d, 2), "pqab" + eos);
}

TEST(PreferenceData, BadRecordsNameFileAndLine) {
  Fixture f;
  const std::string ok = R"({"prompt": "p", "chosen": "a", "rejected": "b"})"
                         "\n";
  auto expect = [&](const std::string& bad, const std::string& what, PreferenceDataOptions o = {}) {
    const std::string e = f.error(ok + bad + "\n", o);
    EXPECT_TRUE(contains(e, "p.jsonl:2")) << e;
    EXPECT_TRUE(contains(e, what)) << e;
  };
  expect(R"({"prompt": "p", "rejected": "b"})", "no \"chosen\"");
  expect(R"({"prompt": "p", "chosen": "", "rejected": "b"})", "completion is empty");
  expect(R"({"prompt": "p", "chosen": "same", "rejected": "same"})", "same");
  expect(R"([1, 2])", "JSON object");
  expect(R"({"prompt": "p", "chosen": "a", "rejected": ["b"]})", "rejected");
  expect(
      R"({"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "user", "content": "a"}], "rejected": [{"role": "assistant", "content": "b"}]})",
      "role 'user' in a completion");
  expect(
      R"({"prompt": [{"role": "assistant", "content": "q"}], "chosen": [{"role": "assistant", "content": "a"}], "rejected": [{"role": "assistant", "content": "b"}]})",
      "must end with the user's turn");
  expect(
      R"({"chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "rejected": [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "b"}]})",
      "share no leading message");
  PreferenceDataOptions o;
  o.max_length = 8;
  expect(R"({"prompt": "a prompt far too long", "chosen": "a", "rejected": "b"})",
         "leave no room for a completion", o);
  PreferenceDataOptions k;
  k.unpaired = true;
  const std::string e = f.error(R"({"prompt": "p", "completion": "a", "label": true})"
                                "\n"
                                R"({"prompt": "p", "completion": "a", "label": "yes"})"
                                "\n",
                                k);
  EXPECT_TRUE(contains(e, "p.jsonl:2") && contains(e, "label")) << e;
  EXPECT_TRUE(contains(f.error("\n\n"), "no record"));
}

}  // namespace
}  // namespace nk
