// A Hugging Face chat model with a chat template of its own (matching no
// built-in) through the whole tool chain (issue 44 items 7, 13): `nekton
// import hf` keeps the template and special tokens under MODEL/tokenizer/;
// `nekton finetune --show-sample` renders a conversation with that template
// and trains the answers; `nekton serve` answers /v1/chat/completions with
// it, tools included, and its /tokenize gives the ids of Hugging Face's own
// rendering (@huggingface/jinja) of the conversation; so does a GGUF
// exported from the imported folder.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "ckpt/hf_test_util.h"
#include "data/chat/jinja_reference.h"
#include "data/tokenizer/bpe_files.h"
#include "data/tokenizer/tokenizer.h"
#include "serve/serve_test_util.h"
#include "test_util.h"

namespace nk {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using test::contains;
namespace fs = std::filesystem;

// No built-in renders like this: a system line, <|user|> / <|bot|> turns,
// answers ended by eos, the tools listed when given.
const char* kTemplate = R"({{- bos_token }}
{%- if tools %}
    {{- '[TOOLS] ' }}
    {%- for t in tools %}{{ t.function.name }}{{ ', ' if not loop.last }}{% endfor %}
    {{- '\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {{- '[SYS] ' + message.content | trim + '\n' }}
    {%- elif message.role == 'user' %}
        {{- '<|user|> ' + message.content | trim + '\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|bot|> ' + message.content | trim + eos_token + '\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|bot|> ' }}
{%- endif %})";

const std::vector<std::string> kSpecials = {"<s>", "</s>", "<|user|>", "<|bot|>"};

// A byte-level BPE tokenizer.json: the 256 bytes, no merges, the specials
// as added tokens from id 256.
json tokenizer_json() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    std::string spelled;
    const uint32_t cp = gpt2_byte_to_codepoint(static_cast<unsigned char>(b));
    if (cp < 0x80) {
      spelled += char(cp);
    } else {
      spelled += char(0xC0 | (cp >> 6));
      spelled += char(0x80 | (cp & 0x3F));
    }
    vocab[spelled] = b;
  }
  json added = json::array();
  for (size_t i = 0; i < kSpecials.size(); ++i)
    added.push_back({{"id", 256 + i}, {"content", kSpecials[i]}, {"special", true}});
  return {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
}

const ojson& conversation() {
  static const ojson c = ojson::parse(R"([
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Teal."},
    {"role": "user", "content": "And a fruit?"},
    {"role": "assistant", "content": "Fig."}])");
  return c;
}

TEST(ChatTemplateCli, ImportedModelsOwnTemplateFinetunesAndServes) {
  REQUIRE_JINJA_REFERENCE();
  test::TempDir d("nk_chat_cli");
  nlohmann::json spec = test::llama_spec();
  spec["vocab"] = 256 + int(kSpecials.size());
  spec["ctx"] = 256;
  const std::string hf = test::write_hf(d, "chat_hf", spec);
  test::write_json(hf + "/tokenizer.json", tokenizer_json());
  test::write_json(hf + "/tokenizer_config.json",
                   {{"chat_template", kTemplate}, {"bos_token", "<s>"}, {"eos_token", "</s>"}});
  // Its end-of-turn ids: </s> and <|user|> (a turn that starts ends the answer).
  test::write_json(hf + "/generation_config.json", {{"eos_token_id", {257, 258}}});

  const std::string nk = d / "chat_nk";
  auto r = test::run_nekton("import hf " + hf + " " + nk);
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_TRUE(fs::exists(nk + "/tokenizer/tokenizer_config.json")) << r.out;
  ASSERT_FALSE(fs::exists(nk + "/tokenizer_config.json"));
  EXPECT_TRUE(fs::exists(nk + "/generation_config.json")) << "generation_config.json is kept";

  // What Hugging Face renders: the conversation for training, and the first
  // question with the generation prompt for serving.
  ojson first_turn = ojson::array({conversation()[0], conversation()[1]});
  const ojson cases = ojson::array({{{"template", kTemplate},
                                     {"messages", conversation()},
                                     {"bos_token", "<s>"},
                                     {"eos_token", "</s>"},
                                     {"add_generation_prompt", false}},
                                    {{"template", kTemplate},
                                     {"messages", first_turn},
                                     {"bos_token", "<s>"},
                                     {"eos_token", "</s>"},
                                     {"add_generation_prompt", true}}});
  const json ref = test::jinja_reference(cases);
  ASSERT_TRUE(ref[0].contains("text") && ref[1].contains("text")) << ref.dump();
  const std::string full = ref[0]["text"], prompt = ref[1]["text"];
  EXPECT_EQ(full,
            "<s>[SYS] You answer briefly.\n<|user|> Name a colour.\n<|bot|> Teal.</s>\n"
            "<|user|> And a fruit?\n<|bot|> Fig.</s>\n");

  // finetune --show-sample: the model's own template, the answers trained.
  const std::string data = d / "chat.jsonl";
  test::write_file(data, ojson{{"messages", conversation()}}.dump() + "\n");
  r = test::run_nekton("finetune train.init_from=" + nk + " data.sft_path=" + data +
                       " train.seq_len=128 train.micro_batch=1 train.global_batch=1 "
                       "train.out_dir=" +
                       std::string(d / "ft") + " --show-sample 0");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "chat template jinja (" + nk + "/tokenizer/tokenizer_config.json"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "--- rendered ---\n" + full)) << r.out;
  EXPECT_TRUE(contains(r.out, "<|bot|> [[Teal.</s>]]\n<|user|> And a fruit?\n<|bot|> [[Fig.</s>]]"))
      << r.out;
  // And it trains on them.
  r = test::run_nekton("finetune train.init_from=" + nk + " data.sft_path=" + data +
                       " train.seq_len=128 train.micro_batch=1 train.global_batch=1 train.steps=2 "
                       "train.val_every=0 train.out_dir=" +
                       std::string(d / "ft"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "chat template jinja")) << r.out;
  // The tuned model keeps the template, the special tokens and the stop ids.
  for (const char* f : {"/model/tokenizer/tokenizer_config.json", "/model/generation_config.json"})
    EXPECT_TRUE(fs::exists(std::string(d / "ft") + f)) << f;

  // serve: /tokenize renders the chat prompt as Hugging Face does.
  test::ServerProcess server(nk, {}, d / "serve.log");
  ASSERT_GT(server.port(), 0) << server.log();
  EXPECT_TRUE(contains(server.log(), "chat template jinja")) << server.log();
  httplib::Client cli = server.client();
  auto t = cli.Post("/tokenize", ojson{{"messages", first_turn}}.dump(), "application/json");
  ASSERT_TRUE(t);
  ASSERT_EQ(t->status, 200) << t->body;
  std::vector<int32_t> want;
  load_tokenizer(nk + "/tokenizer")->encode_with_specials(prompt, want);
  EXPECT_EQ(json::parse(t->body)["tokens"].get<std::vector<int32_t>>(), want) << prompt;
  EXPECT_EQ(want.front(), 256);  // <s> as its id
  auto c = cli.Post("/v1/chat/completions",
                    ojson{{"messages", first_turn}, {"max_tokens", 4}, {"temperature", 0}}.dump(),
                    "application/json");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 200) << c->body;
  EXPECT_EQ(json::parse(c->body)["usage"]["prompt_tokens"], int(want.size())) << c->body;
  // With tools, which the template lists.
  const ojson tools = ojson::parse(
      R"([{"type": "function", "function": {"name": "get_weather", "parameters": {}}}])");
  auto ct = cli.Post("/v1/chat/completions",
                     ojson{{"messages", first_turn}, {"tools", tools}, {"max_tokens", 2}}.dump(),
                     "application/json");
  ASSERT_TRUE(ct);
  EXPECT_EQ(ct->status, 200) << ct->body;
  auto tt = cli.Post("/tokenize", ojson{{"messages", first_turn}, {"tools", tools}}.dump(),
                     "application/json");
  ASSERT_TRUE(tt);
  std::vector<int32_t> with_tools;
  load_tokenizer(nk + "/tokenizer")
      ->encode_with_specials("<s>[TOOLS] get_weather\n" + prompt.substr(3), with_tools);
  EXPECT_EQ(json::parse(tt->body)["tokens"].get<std::vector<int32_t>>(), with_tools);
  server.stop();

  // A GGUF exported from the imported folder carries the template (read from
  // tokenizer/) as tokenizer.chat_template, and serves with it.
  const std::string gguf = d / "chat.gguf";
  r = test::run_nekton("export gguf " + nk + " " + gguf);
  ASSERT_EQ(r.code, 0) << r.out;
  test::ServerProcess from_gguf(gguf, {}, d / "serve_gguf.log");
  ASSERT_GT(from_gguf.port(), 0) << from_gguf.log();
  EXPECT_TRUE(contains(from_gguf.log(), "chat template jinja (" + gguf)) << from_gguf.log();
  auto g = from_gguf.client().Post("/tokenize", ojson{{"messages", first_turn}}.dump(),
                                   "application/json");
  ASSERT_TRUE(g);
  EXPECT_EQ(json::parse(g->body)["tokens"].get<std::vector<int32_t>>(), want) << g->body;
}

}  // namespace
}  // namespace nk
