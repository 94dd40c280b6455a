// SFT samples: records to conversations (and the bad records), the loss mask
// over the tokens of the whole rendered text (byte, byte-level BPE and
// SentencePiece tokenizers), overlong samples cut or dropped and counted, and
// rows whose targets leave the prompts out of the loss.
#include "data/chat/sft_data.h"

#include <gtest/gtest.h>

#include <cmath>

#include "ckpt/gguf_test_util.h"
#include "core/error.h"
#include "model/tiny_config.h"
#include "model/transformer.h"
#include "test_util.h"

namespace nk {
namespace {

using json = nlohmann::json;
using test::contains;
using test::error_of;

TEST(SftData, RecordsInChatAndPromptAnswerForm) {
  SftOptions o;
  auto c = conversation_from_record(json::parse(R"({"messages": [{"role": "user", "content": "hi"},
                                   {"role": "assistant", "content": "hello"}]})"),
                                    o, "f:1");
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[1].role, "assistant");
  EXPECT_EQ(c[1].content, "hello");
  c = conversation_from_record(json::parse(R"({"system": "s", "input": "q", "output": "a"})"), o,
                               "f:2");
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].role, "system");
  EXPECT_EQ(c[1].content, "q");
  EXPECT_EQ(c[2].role, "assistant");
  o.input_key = "question";
  o.output_key = "answer";
  c = conversation_from_record(json::parse(R"({"question": "q", "answer": "a"})"), o, "f:3");
  EXPECT_EQ(c.size(), 2u);
  // Tool calls and results, for a template that shows them: the other keys
  // in their order, a null content beside tool_calls.
  o = SftOptions();
  c = conversation_from_record(nlohmann::ordered_json::parse(R"({"messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function",
          "function": {"name": "w", "arguments": {"z": 1, "a": 2}}}]},
        {"role": "tool", "tool_call_id": "1", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."}]})"),
                               o, "f:4");
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[1].extra.dump(),
            R"({"content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"w",)"
            R"("arguments":{"z":1,"a":2}}}]})");
  EXPECT_EQ(c[2].role, "tool");
  EXPECT_EQ(c[2].extra.dump(), R"({"tool_call_id":"1"})");
}

TEST(SftData, BadRecordsNameTheFileLineAndKey) {
  SftOptions o;
  auto err = [&](const char* text) {
    return error_of([&] { conversation_from_record(json::parse(text), o, "data.jsonl:7"); });
  };
  EXPECT_TRUE(contains(err(R"({"messages": [{"role": "user", "content": "only a question"}]})"),
                       "data.jsonl:7: the conversation has no assistant message"));
  EXPECT_TRUE(contains(err(R"({"messages": [{"role": "user", "content": "q"},
                                            {"role": "tol", "content": "x"}]})"),
                       "data.jsonl:7: messages[1]: role 'tol' is none of system, user, "
                       "assistant, tool"));
  EXPECT_TRUE(contains(err(R"({"messages": [{"role": "user", "content": "q"},
                                            {"role": "assistant", "content": null}]})"),
                       "data.jsonl:7: messages[1]: \"content\" must be a string"));
  EXPECT_TRUE(contains(err(R"({"messages": [{"role": "user", "content": "q"},
                                            {"role": "assistant", "content": null,
                                             "tool_calls": {"a": 1}}]})"),
                       "data.jsonl:7: messages[1]: \"tool_calls\" must be a list"));
  EXPECT_TRUE(contains(err(R"({"messages": [{"role": "user", "content": 5}]})"),
                       "data.jsonl:7: messages[0]: \"content\" must be a string"));
  EXPECT_TRUE(contains(err(R"({"messages": []})"), "\"messages\" must be a non-empty array"));
  EXPECT_TRUE(contains(err(R"({"text": "pretraining text"})"),
                       "data.jsonl:7: neither \"messages\" nor \"input\"/\"output\""));
  EXPECT_TRUE(contains(err(R"({"input": "q", "output": ""})"), "\"output\" is empty"));
  EXPECT_TRUE(contains(err(R"({"input": "q"})"), "data.jsonl:7: no \"output\""));
  EXPECT_TRUE(contains(err(R"([1, 2])"), "a record must be a JSON object"));
}

const std::vector<ChatMessage> kConversation = {{"system", "Be brief."},
                                                {"user", "Capital of France?"},
                                                {"assistant", "Paris."},
                                                {"user", "And of Italy?"},
                                                {"assistant", "Rome, of course."}};

// The text of the tokens the mask marks, run by run.
std::vector<std::string> trained_runs(const SftSample& s, const Tokenizer& tok) {
  std::vector<std::string> runs;
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    if (!s.trained[i]) continue;
    if (i == 0 || !s.trained[i - 1]) runs.emplace_back();
    runs.back() += tok.token_bytes(s.tokens[i]);
  }
  return runs;
}

// With one token per byte the mask is exactly the trained segments' bytes.
TEST(SftData, ByteTokenizerMaskIsTheTrainedBytes) {
  auto tok = load_tokenizer("bytes");
  const auto segs = find_chat_template("chatml").render(kConversation, {"", ""}, false);
  const SftSample s = tokenize_chat(segs, *tok);
  std::string text;
  std::vector<uint8_t> want;
  for (const ChatSegment& g : segs) {
    text += g.text;
    want.insert(want.end(), g.text.size(), g.trained ? 1 : 0);
  }
  EXPECT_EQ(s.tokens, tok->encode(text));
  EXPECT_EQ(s.trained, want);
  EXPECT_EQ(trained_runs(s, *tok),
            (std::vector<std::string>{"Paris.<|im_end|>", "Rome, of course.<|im_end|>"}));
  const SftSample all = tokenize_chat(segs, *tok, LossOn::All);
  EXPECT_EQ(std::count(all.trained.begin(), all.trained.end(), 1), int64_t(all.tokens.size()));
}

// Byte-level BPE and SentencePiece: the tokens are the whole text's (as
// generation encodes it), and the marked tokens spell the answers; with
// SentencePiece the answer's leading space stays one piece with its word.
TEST(SftData, SubwordTokenizersMarkTheAnswerTokens) {
  test::TempDir d("nk_sft_spm");
  auto spm = load_tokenizer(test::train_small_spm(d, 400));
  const ChatSpecials sp{"<s>", "</s>"};
  const auto llama2 = find_chat_template("llama2").render(kConversation, sp, false);
  SftSample s = tokenize_chat(llama2, *spm);
  std::vector<int32_t> whole;
  spm->encode_with_specials(chat_text(llama2), whole);
  EXPECT_EQ(s.tokens, whole);
  auto runs = trained_runs(s, *spm);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_TRUE(contains(runs[0], "Paris. </s>")) << runs[0];
  EXPECT_TRUE(contains(runs[1], "Rome, of course. </s>")) << runs[1];
  EXPECT_FALSE(contains(runs[0] + runs[1], "France")) << runs[0];

  auto bpe = load_tokenizer("gpt2");
  const auto chatml = find_chat_template("chatml").render(kConversation, {"", ""}, false);
  s = tokenize_chat(chatml, *bpe);
  EXPECT_EQ(s.tokens, bpe->encode(chat_text(chatml)));
  runs = trained_runs(s, *bpe);
  EXPECT_EQ(runs, (std::vector<std::string>{"Paris.<|im_end|>", "Rome, of course.<|im_end|>"}));
}

class SftFile : public ::testing::Test {
 protected:
  std::string write(const std::string& lines) {
    const std::string p = (d_.path() / "data.jsonl").string();
    test::write_file(p, lines);
    return p;
  }
  SftData read(const std::string& path, const SftOptions& o, const std::string& tmpl = "chatml") {
    return read_sft_jsonl(path, find_chat_template(tmpl), {"<s>", "</s>"}, *tok_, o);
  }
  test::TempDir d_{"nk_sft_file"};
  std::unique_ptr<Tokenizer> tok_ = load_tokenizer("bytes");
};

TEST_F(SftFile, OverlongSamplesAreCutOrDroppedAndCounted) {
  const std::string p = write(
      R"({"input": "short", "output": "ok"})"
      "\n\n"
      R"({"input": "a much longer question than the limit allows", "output": "answer"})"
      "\n"
      R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})"
      "\n");
  // In bytes: 68, 111 (its answer from byte 94 on) and 63 tokens.
  SftOptions o;
  o.max_tokens = 100;
  SftData t = read(p, o);
  EXPECT_EQ(t.stats.records, 3);
  EXPECT_EQ(t.stats.truncated, 1);
  EXPECT_EQ(t.stats.dropped, 0);
  EXPECT_EQ(t.tokens[1].size(), 100u);
  EXPECT_EQ(t.stats.trained_tokens, 12 + 6 + 11);  // the answers with <|im_end|>; 6 of the cut one
  o.overlong = OverlongSample::Drop;
  SftData dropped = read(p, o);
  EXPECT_EQ(dropped.stats.records, 2);
  EXPECT_EQ(dropped.stats.dropped, 1);
  EXPECT_EQ(dropped.stats.truncated, 0);
  // Cut before the answer starts: nothing left to learn, dropped.
  o.overlong = OverlongSample::Truncate;
  o.max_tokens = 80;
  SftData cut = read(p, o);
  EXPECT_EQ(cut.stats.records, 2);
  EXPECT_EQ(cut.stats.dropped, 1);
  EXPECT_EQ(cut.stats.truncated, 0);
  o.max_tokens = 5;
  EXPECT_TRUE(contains(error_of([&] { read(p, o); }), "no usable sample (3 dropped"));
}

TEST_F(SftFile, ErrorsNameTheLine) {
  const std::string p = write(R"({"input": "q", "output": "a"})"
                              "\n"
                              R"({"input": "q", "output": "a")"
                              "\n");
  EXPECT_TRUE(contains(error_of([&] { read(p, {}); }), p + ":2")) << error_of([&] { read(p, {}); });
  // A conversation the template refuses: Gemma has no system role.
  const std::string q = write(R"({"system": "s", "input": "q", "output": "a"})"
                              "\n");
  const std::string e = error_of([&] { read(q, {}, "gemma"); });
  EXPECT_TRUE(contains(e, q + ":1: chat template gemma: the system role is not supported")) << e;
}

// Rows keep every trained token's target and nothing else, packed or not.
TEST_F(SftFile, RowsTargetOnlyTheTrainedTokens) {
  std::string lines;
  for (int i = 0; i < 30; ++i)
    lines += json{{"input", std::string(size_t(5 + i % 7), 'q')},
                  {"output", std::string(size_t(3 + i % 5), 'a')}}
                 .dump() +
             "\n";
  const SftData data = read(write(lines), {});
  for (bool pack : {false, true}) {
    const PackedRows rows = sft_rows(data, 256, pack, 0);
    int64_t targets = 0;
    for (int32_t t : rows.targets) targets += t != PackedRows::kIgnoreIndex;
    EXPECT_EQ(targets, data.stats.trained_tokens) << "pack " << pack;
    if (pack)
      EXPECT_LT(rows.n_rows, 30);
    else
      EXPECT_EQ(rows.n_rows, 30);
  }
}

// The loss of packed rows equals the loss of the same samples one per row
// (the mean over every trained target of the batch either way): attention
// stays inside each sample and positions restart. f32; 1e-5 relative, the
// two differing only in summation order (tests/model/packed_transformer_test).
TEST_F(SftFile, PackedLossEqualsUnpackedLoss) {
  std::string lines;
  for (int i = 0; i < 12; ++i)
    lines += json{{"input", std::string(size_t(3 + i % 5), char('a' + i))},
                  {"output", std::string(size_t(2 + i % 3), char('k' + i))}}
                 .dump() +
             "\n";
  const SftData data = read(write(lines), {}, "plain");
  const ModelConfig cfg = test::tiny_config(true, 257, 64);
  Transformer model(cfg, DType::F32, 9);
  auto loss_of = [&](bool pack) {
    const PackedRows rows = sft_rows(data, 64, pack, 0);
    const int64_t B = rows.n_rows, T = rows.seq_len;
    PackedBatchInfo info{Tensor::empty({B, rows.max_segments + 1}, DType::I32),
                         Tensor::empty({B, T}, DType::I32)};
    Tensor tokens = Tensor::empty({B, T}, DType::I32), targets = Tensor::empty({B, T}, DType::I32);
    rows.fill_batch(0, tokens, targets, info.position_ids, info.cu_seqlens);
    Activations acts(cfg, DType::F32, B, T, false);
    return std::pair{model.forward_loss(acts, tokens, targets, &info), B};
  };
  const auto [packed, packed_rows] = loss_of(true);
  const auto [alone, alone_rows] = loss_of(false);
  EXPECT_LT(packed_rows, alone_rows);
  EXPECT_EQ(alone_rows, 12);
  EXPECT_NEAR(packed, alone, 1e-5 * std::fabs(alone));
}

}  // namespace
}  // namespace nk
