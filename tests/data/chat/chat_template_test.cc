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
#include "data/chat/jinja_chat_template.h"
#include "data/chat/jinja_reference.h"
#include "data/tokenizer/tokenizer.h"
#include "test_util.h"

namespace nk {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

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

json reference_render(const json& cases) {
  return test::jinja_reference(cases);
}

TEST(ChatTemplate, EveryBuiltInRendersAsItsPublishedJinja) {
  REQUIRE_JINJA_REFERENCE();
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
    if (t.jinja().empty()) continue;
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

// transformers' continue_final_message: the render without a generation
// prompt cut after the final message's content (its last occurrence), the
// trailing white space kept where the template kept it and dropped where the
// template trimmed it or the content opens with white space; a Jinja
// template's text needs no end-of-turn marker after the answer (nothing is
// trained on it).
TEST(ChatTemplate, ContinueFinalMessageCutsAfterTheFinalContent) {
  const ChatTemplate& chatml = find_chat_template("chatml");
  Conversation c = {{"user", "Answer: yes?"}, {"assistant", "Answer:"}};
  auto cut = [&](const ChatTemplate& t) { return continue_final_message(t.text(c, {}, false), c); };
  EXPECT_EQ(cut(chatml),
            "<|im_start|>user\nAnswer: yes?<|im_end|>\n<|im_start|>assistant\nAnswer:");
  c.back().content = "So: ";
  EXPECT_EQ(cut(chatml), "<|im_start|>user\nAnswer: yes?<|im_end|>\n<|im_start|>assistant\nSo: ");
  c.back().content = " So: ";
  EXPECT_EQ(cut(chatml), "<|im_start|>user\nAnswer: yes?<|im_end|>\n<|im_start|>assistant\n So:");
  // A template that trims the content: cut at the stripped content's end.
  auto trim = chat_template_from_jinja(
      "{% for m in messages %}[{{ m.role }}]{{ m.content | trim }}[/]{% endfor %}", "trim");
  c.back().content = "So:  \n";
  EXPECT_EQ(cut(*trim), "[user]Answer: yes?[/][assistant]So:");
  // The content the template rewrote, or no message: named errors.
  auto upper = chat_template_from_jinja(
      "{% for m in messages %}[{{ m.role }}]{{ m.content | upper }}{% endfor %}", "upper");
  c.back().content = "so:";
  EXPECT_TRUE(
      test::contains(test::error_of([&] { cut(*upper); }),
                     "continue_final_message: the final message does not appear in the chat"));
  EXPECT_TRUE(
      test::contains(test::error_of([&] { continue_final_message("x", {}); }), "no final message"));
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
// layout (line breaks, '\n' written as a real line break); another template
// is rendered as the Jinja it is; no template at all is an error naming the
// file, never a silent fallback.
TEST(ChatTemplate, AutoReadsTheModelsTokenizerConfig) {
  test::TempDir d("nk_chat_auto");
  const std::string dir = d.path().string(), file = dir + "/tokenizer_config.json";
  for (const std::string& name : chat_template_names()) {
    const ChatTemplate& t = find_chat_template(name);
    if (t.jinja().empty()) continue;
    const std::string reflowed =
        replace_all(replace_all(t.jinja(), "%}{%", "%}\n  {%"), "\\n", "\n");
    std::ofstream(file) << json{{"chat_template", reflowed}, {"bos_token", "<s>"}}.dump();
    EXPECT_EQ(chat_template_for("auto", dir).get(), &t) << name;
    EXPECT_EQ(chat_template_for("", dir).get(), &t) << name;
  }
  EXPECT_EQ(chat_template_for("gemma", dir).get(), &find_chat_template("gemma"));  // a name wins

  // A template of its own: rendered as Jinja, named after the file.
  std::ofstream(file) << json{{"chat_template", "{{ messages[0]['content'] }}!"}}.dump();
  auto own = chat_template_for("auto", dir);
  EXPECT_TRUE(test::contains(own->name(), file)) << own->name();
  EXPECT_EQ(chat_text(own->render({{"user", "hi"}}, {}, true)), "hi!");

  std::ofstream(file) << json{{"bos_token", "<s>"}}.dump();
  std::string e = test::error_of([&] { chat_template_for("auto", dir); });
  EXPECT_TRUE(test::contains(e, file + " has no chat_template")) << e;
  fs::remove(file);
  e = test::error_of([&] { chat_template_for("auto", dir); });
  EXPECT_TRUE(test::contains(e, "tokenizer/tokenizer_config.json")) << e;
  EXPECT_TRUE(test::contains(e, "chatml, llama3")) << e;
}

// Issue 44 item 7: `nekton import hf` keeps tokenizer_config.json under
// MODEL/tokenizer/; auto reads it there (and a chat_template.jinja, where
// newer transformers keep the template).
TEST(ChatTemplate, AutoReadsTheTokenizerSubfolderOfAnImportedModel) {
  test::TempDir d("nk_chat_sub");
  const std::string dir = d.path().string();
  fs::create_directories(dir + "/tokenizer");
  std::ofstream(dir + "/tokenizer/tokenizer_config.json")
      << json{{"chat_template", find_chat_template("llama3").jinja()}}.dump();
  EXPECT_EQ(chat_template_for("auto", dir).get(), &find_chat_template("llama3"));
  std::ofstream(dir + "/tokenizer/tokenizer_config.json") << json{{"eos_token", "</s>"}}.dump();
  std::ofstream(dir + "/tokenizer/chat_template.jinja") << "[{{ messages | length }}]";
  EXPECT_EQ(chat_text(chat_template_for("auto", dir)->render({{"user", "a"}}, {}, false)), "[1]");
  // Both: chat_template.jinja wins, as transformers' from_pretrained lets it
  // (nekton finetune writes the template it trained with there).
  std::ofstream(dir + "/tokenizer/tokenizer_config.json")
      << json{{"chat_template", find_chat_template("llama3").jinja()}}.dump();
  std::ofstream(dir + "/chat_template.jinja") << find_chat_template("chatml").jinja();
  EXPECT_EQ(chat_template_for("auto", dir).get(), &find_chat_template("chatml"));
}

// Hugging Face's list form: "default", and "tool_use" when tools are given.
TEST(ChatTemplate, ListFormPicksToolUseWhenToolsAreGiven) {
  test::TempDir d("nk_chat_list");
  const std::string dir = d.path().string();
  std::ofstream(dir + "/tokenizer_config.json") << json{
      {"chat_template",
       {{{"name", "default"}, {"template", "plain:{{ messages[0].content }}"}},
        {{"name", "tool_use"},
         {"template", "tools:{{ tools | length }}"}}}}}.dump();
  auto t = chat_template_for("auto", dir);
  const std::vector<ChatMessage> m = {{"user", "q"}};
  EXPECT_EQ(chat_text(t->render(m, {}, true)), "plain:q");
  EXPECT_EQ(chat_text(t->render(m, {}, true, nlohmann::ordered_json::parse(R"([{"a": 1}])"))),
            "tools:1");
  // Only a default that is a built-in: the built-in.
  std::ofstream(dir + "/tokenizer_config.json")
      << json{{"chat_template",
               {{{"name", "default"}, {"template", find_chat_template("chatml").jinja()}}}}}
             .dump();
  EXPECT_EQ(chat_template_for("auto", dir).get(), &find_chat_template("chatml"));
  std::ofstream(dir + "/tokenizer_config.json")
      << json{{"chat_template", {{{"template", "x"}}}}}.dump();
  EXPECT_TRUE(
      test::contains(test::error_of([&] { chat_template_for("auto", dir); }), "chat_template[0]"));
}

// data.chat_template=FILE.jinja: the file's template (a built-in when it is one).
TEST(ChatTemplate, AJinjaFileByPath) {
  test::TempDir d("nk_chat_file");
  const std::string f = d / "mine.jinja";
  std::ofstream(f) << "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}\n";
  auto t = chat_template_for(f, "");
  EXPECT_EQ(chat_text(t->render({{"user", "a"}, {"assistant", "b"}}, {}, true)),
            "<user>a<assistant>b");
  std::ofstream(f) << find_chat_template("phi3").jinja();
  EXPECT_EQ(chat_template_for(f, "").get(), &find_chat_template("phi3"));
  std::ofstream(f) << "{% if %}";
  const std::string e = test::error_of([&] { chat_template_for(f, ""); });
  EXPECT_TRUE(test::contains(e, f + ":1:")) << e;
  EXPECT_TRUE(test::contains(test::error_of([&] { chat_template_for(d / "none.jinja", ""); }),
                             "does not exist"));
  EXPECT_TRUE(
      test::contains(test::error_of([&] { chat_template_for("vicuna", ""); }), "or a .jinja file"));
}

// The Jinja path on each built-in's published source gives the built-in's
// segments exactly: the same text and the same trained spans, and refuses
// what it refuses.
TEST(ChatTemplate, JinjaSegmentsOfThePublishedSourcesAreTheBuiltIns) {
  int compared = 0;
  for (const std::string& name : chat_template_names()) {
    const ChatTemplate& builtin = find_chat_template(name);
    if (builtin.jinja().empty()) continue;
    const JinjaChatTemplate jinja({{"", builtin.jinja()}}, name + ".jinja");
    const ChatSpecials s = specials_of(name);
    for (const Conversation& c : conversations())
      for (bool gen : {false, true}) {
        SCOPED_TRACE(name + ": " + to_json(c).dump() + (gen ? " (generation prompt)" : ""));
        std::vector<ChatSegment> want;
        try {
          want = builtin.render(c, s, gen);
        } catch (const Error&) {
          EXPECT_THROW(jinja.render(c, s, gen), Error);
          continue;
        }
        std::vector<ChatSegment> got;
        ASSERT_NO_THROW(got = jinja.render(c, s, gen));
        EXPECT_EQ(chat_text(got), chat_text(want));
        if (gen) continue;  // a prompt's segments are not trained
        ASSERT_EQ(got.size(), want.size());
        for (size_t k = 0; k < got.size(); ++k) {
          EXPECT_EQ(got[k].text, want[k].text) << k;
          EXPECT_EQ(got[k].trained, want[k].trained) << k;
        }
        ++compared;
      }
  }
  EXPECT_GE(compared, 6 * 5);
}

}  // namespace
}  // namespace nk
