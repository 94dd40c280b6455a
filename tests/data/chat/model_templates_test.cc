// Models' own chat templates (tests/data/chat/templates/*.jinja, written out
// from the models' published tokenizer_config.json: Llama 3.1 with its tools
// block, Qwen2.5 and Qwen3 with tools (and Qwen3's <think> handling),
// Mistral-7B-Instruct-v0.3 with [AVAILABLE_TOOLS], Gemma 2 and 3, Phi-3-mini)
// rendered by Nekton's Jinja byte for byte as Hugging Face's own
// (@huggingface/jinja) renders them, on conversations with system prompts,
// tools, tool calls and results and several turns, with and without the
// generation prompt, and refused where the reference raises. Then what
// fine-tuning trains on: each answer and its end-of-turn marker, or a clear
// refusal naming the message when the template rewrites earlier turns.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "data/chat/chat_template.h"
#include "data/chat/jinja_chat_template.h"
#include "data/chat/jinja_reference.h"
#include "test_paths.h"
#include "test_util.h"

namespace nk {
namespace {

using ojson = nlohmann::ordered_json;
using test::contains;

struct Model {
  std::string file;  // under tests/data/chat/templates/
  ChatSpecials specials;
};

const std::vector<Model>& models() {
  static const std::vector<Model> m = {
      {"llama3.1.jinja", {"<|begin_of_text|>", "<|eot_id|>"}},
      {"qwen2.5.jinja", {"", "<|im_end|>"}},
      {"qwen3.jinja", {"", "<|im_end|>"}},
      {"mistral-v0.3.jinja", {"<s>", "</s>"}},
      {"gemma2.jinja", {"<bos>", "<eos>"}},
      {"gemma3.jinja", {"<bos>", "<eos>"}},
      {"phi3-mini.jinja", {"<s>", "<|endoftext|>"}},
  };
  return m;
}

std::string source(const std::string& file) {
  return test::read_file(std::string(NK_SOURCE_DIR) + "/tests/data/chat/templates/" + file);
}

const ojson& tools() {
  static const ojson t = ojson::parse(R"([
    {"type": "function", "function": {"name": "get_weather",
      "description": "The current weather in a city",
      "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
       "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "a + b",
      "parameters": {"type": "object", "properties": {"a": {"type": "number"},
        "b": {"type": "number"}}}, "return": {"type": "number"}}}
  ])");
  return t;
}

// Conversations as OpenAI sends them (keys in this order).
const std::vector<ojson>& conversations() {
  static const std::vector<ojson> c = {
      ojson::parse(R"([{"role": "user", "content": "Hello!"}])"),
      ojson::parse(R"([{"role": "system", "content": "You are terse."},
                       {"role": "user", "content": "Name a colour."},
                       {"role": "assistant", "content": "Teal."},
                       {"role": "user", "content": "Another?"}])"),
      ojson::parse(R"([{"role": "user", "content": "  What is 2+2?  "},
                       {"role": "assistant", "content": " 4 "},
                       {"role": "user", "content": "And 3+3?"},
                       {"role": "assistant", "content": "6"}])"),
      ojson::parse(R"([{"role": "system", "content": "Be kind."},
                       {"role": "user", "content": "Reverse 'héllo 世界 😀'."},
                       {"role": "assistant", "content": "😀 界世 olléh"}])"),
      ojson::parse(R"([{"role": "system", "content": "You can look up the weather."},
                       {"role": "user", "content": "What's the weather in Paris?"},
                       {"role": "assistant", "content": null, "tool_calls": [
                         {"id": "call12345", "type": "function", "function": {
                           "name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
                       {"role": "tool", "tool_call_id": "call12345", "content": "{\"temp\": 21}"},
                       {"role": "assistant", "content": "It is 21 °C in Paris."}])"),
      ojson::parse(R"([{"role": "user", "content": "Think first: 7*6?"},
                       {"role": "assistant", "content": "<think>\n7*6 is 42.\n</think>\n\n42"},
                       {"role": "user", "content": "Thanks"}])"),
      ojson::parse(R"([{"role": "user", "content": "Think: 1+1?"},
                       {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\n2"}])"),
      ojson::parse(R"([{"role": "assistant", "content": "I speak first."},
                       {"role": "user", "content": "ok"}])"),
      ojson::parse(R"([{"role": "user", "content": "one"}, {"role": "user", "content": "two"}])"),
  };
  return c;
}

std::vector<ChatMessage> messages_of(const ojson& conv) {
  std::vector<ChatMessage> out;
  for (const ojson& m : conv) {
    ChatMessage x(m["role"].get<std::string>(),
                  m["content"].is_string() ? m["content"].get<std::string>() : "");
    for (auto it = m.begin(); it != m.end(); ++it) {
      if (it.key() == "role" || (it.key() == "content" && it.value().is_string())) continue;
      if (x.extra.is_null()) x.extra = ojson::object();
      x.extra[it.key()] = it.value();
    }
    out.push_back(std::move(x));
  }
  return out;
}

TEST(ModelChatTemplates, RenderLikeHuggingFacesJinja) {
  REQUIRE_JINJA_REFERENCE();
  struct Case {
    size_t model, conv;
    bool gen, with_tools;
  };
  std::vector<Case> index;
  ojson cases = ojson::array();
  for (size_t m = 0; m < models().size(); ++m)
    for (size_t c = 0; c < conversations().size(); ++c)
      for (bool gen : {false, true})
        for (bool with_tools : {false, true}) {
          ojson k = {{"template", source(models()[m].file)},
                     {"messages", conversations()[c]},
                     {"bos_token", models()[m].specials.bos},
                     {"eos_token", models()[m].specials.eos},
                     {"add_generation_prompt", gen}};
          if (with_tools) k["tools"] = tools();
          cases.push_back(std::move(k));
          index.push_back({m, c, gen, with_tools});
        }
  const nlohmann::json ref = test::jinja_reference(cases);
  ASSERT_EQ(ref.size(), index.size());
  std::map<std::string, int> compared, refused;
  for (size_t i = 0; i < index.size(); ++i) {
    const Case& k = index[i];
    const Model& model = models()[k.model];
    SCOPED_TRACE(model.file + ", conversation " + std::to_string(k.conv) +
                 (k.gen ? ", generation prompt" : "") + (k.with_tools ? ", tools" : ""));
    const JinjaChatTemplate t({{"", source(model.file)}}, model.file);
    const std::vector<ChatMessage> msgs = messages_of(conversations()[k.conv]);
    const ojson tl = k.with_tools ? tools() : ojson();
    if (ref[i].contains("error")) {
      EXPECT_THROW(t.render_text(msgs, model.specials, k.gen, tl), Error)
          << "the reference refuses: " << ref[i]["error"];
      ++refused[model.file];
      continue;
    }
    std::string got;
    ASSERT_NO_THROW(got = t.render_text(msgs, model.specials, k.gen, tl));
    EXPECT_EQ(got, ref[i]["text"].get<std::string>());
    ++compared[model.file];
  }
  // Every template renders most cases, tools included, and refuses some.
  for (const Model& m : models()) {
    EXPECT_GE(compared[m.file], 12) << m.file;
    std::cout << "[ " << m.file << " ] " << compared[m.file] << " renders equal to the reference, "
              << refused[m.file] << " refused by both\n";
  }
  EXPECT_GE(refused["mistral-v0.3.jinja"], 4);
  EXPECT_GE(refused["gemma2.jinja"], 4);
}

// The trained texts of conversation `conv` under template `file`.
std::vector<std::string> trained(const std::string& file, const ChatSpecials& s, size_t conv,
                                 const ojson& tl = nullptr) {
  const JinjaChatTemplate t({{"", source(file)}}, file);
  std::vector<std::string> out;
  const auto segs = t.render(messages_of(conversations()[conv]), s, false, tl);
  EXPECT_EQ(chat_text(segs), t.render_text(messages_of(conversations()[conv]), s, false, tl));
  for (const ChatSegment& x : segs)
    if (x.trained) out.push_back(x.text);
  return out;
}

// What fine-tuning learns from each template: the answers as the whole
// conversation shows them, each with its end-of-turn marker.
TEST(ModelChatTemplates, TrainedSpansAreTheAnswersAndTheirEndOfTurn) {
  using V = std::vector<std::string>;
  const ChatSpecials llama{"<|begin_of_text|>", "<|eot_id|>"}, qwen{"", "<|im_end|>"},
      gemma{"<bos>", "<eos>"}, mistral{"<s>", "</s>"}, phi{"<s>", "<|endoftext|>"};
  EXPECT_EQ(trained("llama3.1.jinja", llama, 2), (V{"4<|eot_id|>", "6<|eot_id|>"}));
  EXPECT_EQ(trained("llama3.1.jinja", llama, 4),
            (V{"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": "
               "\"celsius\"}}<|eot_id|>",
               "It is 21 °C in Paris.<|eot_id|>"}));
  EXPECT_EQ(trained("llama3.1.jinja", llama, 4, tools()).size(), 2u);
  EXPECT_EQ(trained("qwen2.5.jinja", qwen, 2), (V{" 4 <|im_end|>", "6<|im_end|>"}));
  EXPECT_EQ(trained("qwen2.5.jinja", qwen, 4, tools()),
            (V{"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
               "\"unit\": \"celsius\"}}\n</tool_call><|im_end|>",
               "It is 21 °C in Paris.<|im_end|>"}));
  // Qwen3 drops the reasoning of turns before the last question and writes
  // an empty <think> block into the last answer: each turn as the whole
  // conversation has it.
  EXPECT_EQ(trained("qwen3.jinja", qwen, 2),
            (V{" 4 <|im_end|>", "<think>\n\n</think>\n\n6<|im_end|>"}));
  EXPECT_EQ(trained("qwen3.jinja", qwen, 5), (V{"42<|im_end|>"}));
  EXPECT_EQ(trained("qwen3.jinja", qwen, 6), (V{"<think>\nEasy.\n</think>\n\n2<|im_end|>"}));
  EXPECT_EQ(trained("gemma2.jinja", gemma, 2), (V{"4<end_of_turn>", "6<end_of_turn>"}));
  EXPECT_EQ(trained("gemma3.jinja", gemma, 3), (V{"😀 界世 olléh<end_of_turn>"}));
  EXPECT_EQ(trained("mistral-v0.3.jinja", mistral, 2), (V{" 4</s>", " 6</s>"}));
  EXPECT_EQ(trained("phi3-mini.jinja", phi, 2), (V{" 4 <|end|>", "6<|end|>"}));
}

// Mistral v0.3 writes the system prompt into the last user turn only, so
// the conversation before an answer is not the start of the whole one: the
// answer cannot be told apart, and the error says which message.
TEST(ModelChatTemplates, RefusesToTrainWhenEarlierTurnsChange) {
  const JinjaChatTemplate t({{"", source("mistral-v0.3.jinja")}}, "mistral-v0.3.jinja");
  const std::string e = test::error_of([&] {
    t.render(messages_of(conversations()[3]), {"<s>", "</s>"}, false);
  });
  EXPECT_TRUE(contains(e, "mistral-v0.3.jinja: messages[2] (assistant)")) << e;
  EXPECT_TRUE(contains(e, "does not begin")) << e;
  // Serving the same conversation is fine: one render.
  EXPECT_NO_THROW(t.render(messages_of(conversations()[3]), {"<s>", "</s>"}, true));
  // A template whose answers end with no marker at all.
  const JinjaChatTemplate bare({{"", "{% for m in messages %}{{ m.content }}\n{% endfor %}"}},
                               "bare.jinja");
  const std::string b = test::error_of([&] {
    bare.render(messages_of(conversations()[2]), {"<s>", "</s>"}, false);
  });
  EXPECT_TRUE(contains(b, "messages[1] (assistant): no end-of-turn marker")) << b;
}

}  // namespace
}  // namespace nk
