// The built-in chat templates against the published Jinja templates rendered
// by Hugging Face's own Jinja (@huggingface/jinja, tests/data/chat/render.js):
// the same text, or a refusal where the published template raises, on
// conversations with and without a system message, several turns, an open
// user turn (generation prompt) and contents with surrounding white space.
#include "data/chat/chat_template.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/tokenizer/tokenizer.h"
#include "test_util.h"

namespace nk {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool have_reference() {
  return std::system("node --version > /dev/null 2>&1") == 0 &&
         fs::exists(fs::path(assets_dir()) / "npm/node_modules/@huggingface/jinja/package.json");
}
#define REQUIRE_REFERENCE() NK_REQUIRE_ASSET(have_reference(), "node or @huggingface/jinja")

// The special-token strings of each family's tokenizer.
ChatSpecials specials_of(const std::string& name) {
  if (name == "llama3") return {"<|begin_of_text|>", "<|eot_id|>"};
  if (name == "gemma") return {"<bos>", "<eos>"};
  if (name == "phi3") return {"<s>", "<|endoftext|>"};
  if (name == "chatml") return {"", "<|endoftext|>"};
  return {"<s>", "</s>"};  // llama2, mistral
}

using Conversation = std::vector<ChatMessage>;

std::vector<Conversation> conversations() {
  return {
      {{"user", "Hello!"}},
      {{"user", "What is 2+2?"}, {"assistant", "4"}},
      {{"system", "You are terse."}, {"user", "Name a colour."}, {"assistant", "Teal."}},
      {{"user", "Reverse 'abc'."},
       {"assistant", "cba"},
       {"user", "And 'héllo 世界'?"},
       {"assistant", "界世 olléh"}},
      {{"system", "  Be kind.\n"},
       {"user", "\tpadded question  "},
       {"assistant", "  padded answer \n"},
       {"user", "next"}},
      {{"user", "  spaced  "}, {"assistant", "\n answer\t"}},
      {{"assistant", "I speak first."}, {"user", "ok"}},             // out of order
      {{"user", "one"}, {"user", "two"}},                            // two users
      {{"user", "q"}, {"tool", "result"}},                           // a role most refuse
      {{"system", "only a system message"}, {"user", "and a user"}}  // system first
  };
}

json to_json(const Conversation& c) {
  json a = json::array();
  for (const ChatMessage& m : c) a.push_back({{"role", m.role}, {"content", m.content}});
  return a;
}

// Renders every case with the reference; {"text"} or {"error"} each.
json reference_render(const json& cases) {
  test::TempDir d("nk_chat_template");
  const std::string in = (d.path() / "cases.json").string(), out = (d.path() / "out.json").string();
  std::ofstream(in) << cases.dump();
  const std::string cmd = "NEKTON_ASSETS='" + assets_dir() +
                          "' node '" NK_SOURCE_DIR "/tests/data/chat/render.js' '" + in + "' '" +
                          out + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(out);
  return json::parse(f);
}

TEST(ChatTemplate, EveryBuiltInRendersAsItsPublishedJinja) {
  REQUIRE_REFERENCE();
  json cases = json::array();
  struct Case {
    std::string name;
    size_t conv;
    bool gen;
  };
  std::vector<Case> index;
  const auto convs = conversations();
  for (const std::string& name : chat_template_names()) {
    const ChatTemplate& t = find_chat_template(name);
    if (t.jinja().empty()) continue;  // plain: no published template
    const ChatSpecials s = specials_of(name);
    for (size_t c = 0; c < convs.size(); ++c)
      for (bool gen : {false, true}) {
        cases.push_back({{"template", t.jinja()},
                         {"messages", to_json(convs[c])},
                         {"bos_token", s.bos},
                         {"eos_token", s.eos},
                         {"add_generation_prompt", gen}});
        index.push_back({name, c, gen});
      }
  }
  const json ref = reference_render(cases);
  ASSERT_EQ(ref.size(), index.size());
  int compared = 0, refused = 0;
  for (size_t i = 0; i < index.size(); ++i) {
    const Case& k = index[i];
    const ChatTemplate& t = find_chat_template(k.name);
    SCOPED_TRACE(k.name + ", conversation " + std::to_string(k.conv) +
                 (k.gen ? ", generation prompt" : ""));
    if (ref[i].contains("error")) {
      EXPECT_THROW(t.render(convs[k.conv], specials_of(k.name), k.gen), Error)
          << "the published template refuses: " << ref[i]["error"];
      ++refused;
      continue;
    }
    std::vector<ChatSegment> segs;
    ASSERT_NO_THROW(segs = t.render(convs[k.conv], specials_of(k.name), k.gen));
    EXPECT_EQ(chat_text(segs), ref[i]["text"].get<std::string>());
    ++compared;
  }
  // Every template renders the valid conversations and refuses some others.
  EXPECT_GE(compared, 6 * 9);
  EXPECT_GE(refused, 6);
}

// The trained segments' texts of `c` rendered by template `name`.
std::vector<std::string> trained_texts(const std::string& name, const Conversation& c) {
  std::vector<std::string> r;
  for (const ChatSegment& s : find_chat_template(name).render(c, specials_of(name), false))
    if (s.trained) r.push_back(s.text);
  return r;
}

// The loss covers each answer and the end-of-turn marker after it, nothing
// of the prompt side.
TEST(ChatTemplate, TrainedSegmentsAreTheAnswersWithTheirEndOfTurn) {
  const Conversation c = {{"system", "Sys."},
                          {"user", "Question one?"},
                          {"assistant", "Answer one."},
                          {"user", "Question two?"},
                          {"assistant", "Answer two."}};
  const std::map<std::string, std::vector<std::string>> want = {
      {"chatml", {"Answer one.<|im_end|>", "Answer two.<|im_end|>"}},
      {"llama3", {"Answer one.<|eot_id|>", "Answer two.<|eot_id|>"}},
      {"llama2", {" Answer one. </s>", " Answer two. </s>"}},
      {"phi3", {"Answer one.<|end|>", "Answer two.<|end|>"}},
      {"plain", {"Answer one.</s>", "Answer two.</s>"}}};
  for (const auto& [name, answers] : want) EXPECT_EQ(trained_texts(name, c), answers) << name;
  // Mistral and Gemma have no system role: the same without it.
  const Conversation n(c.begin() + 1, c.end());
  const std::map<std::string, std::vector<std::string>> want2 = {
      {"mistral", {"Answer one.</s>", "Answer two.</s>"}},
      {"gemma", {"Answer one.<end_of_turn>", "Answer two.<end_of_turn>"}}};
  for (const auto& [name, answers] : want2) EXPECT_EQ(trained_texts(name, n), answers) << name;
}

TEST(ChatTemplate, UnknownNameListsTheKnownOnes) {
  try {
    find_chat_template("vicuna");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "unknown chat template 'vicuna'")) << e.what();
    EXPECT_TRUE(test::contains(e.what(), "chatml, llama3, llama2, mistral, gemma, phi3, plain"))
        << e.what();
  }
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
  std::string r;
  size_t at = 0;
  for (size_t next; (next = s.find(from, at)) != std::string::npos; at = next + from.size())
    r += s.substr(at, next - at) + to;
  return r + s.substr(at);
}

// tokenizer_config.json's chat_template picks the built-in, whatever its
// layout (line breaks, '\n' written as a real line break); an unknown one is
// an error naming the file, never a silent fallback.
TEST(ChatTemplate, AutoReadsTheModelsTokenizerConfig) {
  test::TempDir d("nk_chat_auto");
  const std::string dir = d.path().string(), file = dir + "/tokenizer_config.json";
  for (const std::string& name : chat_template_names()) {
    const ChatTemplate& t = find_chat_template(name);
    if (t.jinja().empty()) continue;
    const std::string reflowed =
        replace_all(replace_all(t.jinja(), "%}{%", "%}\n  {%"), "\\n", "\n");
    std::ofstream(file) << json{{"chat_template", reflowed}, {"bos_token", "<s>"}}.dump();
    EXPECT_EQ(&chat_template_for("auto", dir), &t) << name;
    EXPECT_EQ(&chat_template_for("", dir), &t) << name;
  }
  EXPECT_EQ(&chat_template_for("gemma", dir), &find_chat_template("gemma"));  // a name wins

  std::ofstream(file) << json{{"chat_template", "{{ messages[0]['content'] }}"}}.dump();
  try {
    chat_template_for("auto", dir);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), file)) << e.what();
    EXPECT_TRUE(test::contains(e.what(), "none of the built-in templates")) << e.what();
  }
  std::ofstream(file) << json{{"bos_token", "<s>"}}.dump();
  EXPECT_THROW(chat_template_for("auto", dir), Error);
  fs::remove(file);
  EXPECT_THROW(chat_template_for("auto", dir), Error);
}

}  // namespace
}  // namespace nk
