// A Jinja template as Hugging Face renders chat templates (the public face
// of data/jinja): parsed once, rendered any number of times, from any number
// of threads, each render over its own variables.
//
//   jinja::Template t(source, "DIR/tokenizer_config.json");
//   std::string text = t.render({{"messages", ...}, {"add_generation_prompt", true}});
//
// Rendering matches @huggingface/jinja (what the tests compare with) byte
// for byte on the templates models ship; see builtins.h for what a template
// can call.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/jinja/ast.h"

namespace nk::jinja {

// "NAME:LINE:COL: MESSAGE". raised: the template's own raise_exception(),
// whose text is `detail`.
class TemplateError : public Error {
 public:
  TemplateError(const std::string& msg, std::string detail, bool raised)
      : Error(msg), detail(std::move(detail)), raised(raised) {}
  std::string detail;
  bool raised;
};

class Template {
 public:
  // TemplateError for a syntax error, naming `name`, the line and column.
  // chat = false: Python Jinja's whitespace defaults instead of the chat
  // template ones (see tokenize in lexer.h).
  Template(std::string source, std::string name, bool chat = true);
  // The text for the variables of `context` (a JSON object). TemplateError
  // for a template that raises or fails, or runs past the interpreter's
  // step, depth or size bounds.
  // strict_undefined: printing an undefined value fails (Interpreter).
  std::string render(const nlohmann::ordered_json& context, bool strict_undefined = false) const;
  const std::string& name() const { return name_; }
  const std::string& source() const { return source_; }

 private:
  [[noreturn]] void fail(const std::string& message, uint32_t pos, bool raised) const;
  std::string source_, name_;
  Nodes program_;
};

}  // namespace nk::jinja
