// A document turned into what lm-evaluation-harness (v0.4.9) sends the model:
// doc_to_text / doc_to_target / doc_to_choice (a document field when the
// setting names one, else a Jinja template over the document's fields,
// undefined fields an error as with the harness's StrictUndefined), and the
// few-shot context:
//
//   description + Σ_shots (text + target_delimiter + answer + fewshot_delimiter) + text
//
// where a shot with an empty target contributes its text alone, an integer
// target is its choice, and a list target its first item. Shots are drawn by
// FewshotSampler.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/chat/chat_template.h"
#include "data/jinja/template.h"
#include "eval/py_random.h"
#include "eval/task_config.h"

namespace nk {

// Where a document is, for messages: "TASK.yaml: FILE: document I: FIELD: why".
struct DocRef {
  const TaskConfig* task = nullptr;
  const std::string* file = nullptr;
  int64_t index = 0;
  [[noreturn]] void fail_field(const std::string& field, const std::string& why) const;
};

// How a context is laid out beyond the task's own settings (the harness's
// --system_instruction, --apply_chat_template, --fewshot_as_multiturn). With
// a system instruction the system prompt is instruction + fewshot_delimiter +
// description (either alone when the other is empty). Without a chat
// template the prompt is that text followed by the shots and the question.
// With one, the messages are: the system prompt; the shots as one user
// message holding their text (or, multiturn, a user message and an
// assistant answer per shot); the question appended to the last user message
// (a new one after a system message or multiturn shots); rendered with
// add_generation_prompt, or, with a gen_prefix, with an assistant message
// of it continued (continue_final_message) and every multiturn answer led
// by it and a space; multiple_choice continuations lose their
// target_delimiter.
struct PromptStyle {
  std::string system_instruction;
  std::shared_ptr<const ChatTemplate> chat;  // null: plain text
  ChatSpecials specials;
  bool multiturn = false;
};

class TaskPrompter {
 public:
  explicit TaskPrompter(const TaskConfig& c, PromptStyle style = {});
  // What goes between a multiple_choice context and each choice.
  std::string choice_delimiter() const { return style_.chat ? "" : c_.target_delimiter; }
  // A string, or (rendered digits with choices) an integer.
  nlohmann::ordered_json text(const nlohmann::ordered_json& doc, const DocRef& at) const;
  // An integer (rendered digits with choices), a list (rendered "[...]"), or a string.
  nlohmann::ordered_json target(const nlohmann::ordered_json& doc, const DocRef& at) const;
  // The choices; nk::Error unless they are a list of strings.
  std::vector<std::string> choices(const nlohmann::ordered_json& doc, const DocRef& at) const;
  // The text of a target as a few-shot answer or a loglikelihood continuation.
  std::string answer(const nlohmann::ordered_json& doc, const nlohmann::ordered_json& target,
                     const DocRef& at) const;
  // The full context of `doc` after `shots` (docs of the few-shot split),
  // ending in target_delimiter + gen_prefix when the task has one (with a
  // chat template: the assistant's turn opened by it, continue_final_message).
  std::string context(
      const nlohmann::ordered_json& doc, const DocRef& at,
      const std::vector<std::pair<const nlohmann::ordered_json*, DocRef>>& shots) const;
  // A multiple-input task's (Winogrande's) context without the question:
  // description + shots, each shot's text its gold context (the choice its
  // doc_to_text indexes). Each choice (a partial context) is appended to it.
  // nk::Error with a chat template (not supported for these tasks).
  std::string labeled_examples(
      const nlohmann::ordered_json& doc, const DocRef& at,
      const std::vector<std::pair<const nlohmann::ordered_json*, DocRef>>& shots) const;

 private:
  // The system prompt (instruction and description) and the shots' text.
  std::pair<std::string, std::string> preamble(
      const nlohmann::ordered_json& doc, const DocRef& at,
      const std::vector<std::pair<const nlohmann::ordered_json*, DocRef>>& shots) const;
  std::string text_of(const nlohmann::ordered_json& doc, const DocRef& at) const;
  nlohmann::ordered_json resolve(const std::string& spec, const jinja::Template& t,
                                 const nlohmann::ordered_json& doc, const DocRef& at,
                                 const char* field) const;
  // The scored document's gen_prefix text; nullopt when the task has none.
  std::optional<std::string> prefix(const nlohmann::ordered_json& doc, const DocRef& at) const;
  const TaskConfig& c_;
  PromptStyle style_;
  jinja::Template text_, target_, choice_, description_, prefix_;
};

// The harness's few-shot draw: random.Random(1234).sample(pool, n) (one
// generator for the whole task, in document order), one more when the pool
// is the scored split and the scored document (any document equal to it)
// then left out; first_n takes the pool's first n instead.
class FewshotSampler {
 public:
  FewshotSampler(const TaskConfig& c, const std::vector<nlohmann::ordered_json>* pool,
                 uint64_t seed = 1234);
  // Indices into the pool. nk::Error when the pool is too small.
  std::vector<int64_t> draw(const nlohmann::ordered_json& doc, int64_t n);

 private:
  const TaskConfig& c_;
  const std::vector<nlohmann::ordered_json>* pool_;
  PyRandom rnd_;
};

// Python's ast.literal_eval of a list literal as a template renders one
// (['a', 'b'], or JSON's ["a", "b"]): strings, numbers, True/False/None,
// nested lists. nk::Error with `what` for anything else.
nlohmann::ordered_json parse_list_literal(const std::string& s, const std::string& what);

}  // namespace nk
