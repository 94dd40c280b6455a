#include "data/jinja/template.h"

#include "data/jinja/builtins.h"
#include "data/jinja/interpreter.h"
#include "data/jinja/lexer.h"
#include "data/jinja/parser.h"
#include "data/jinja/render_error.h"

namespace nk::jinja {

Template::Template(std::string source, std::string name, bool chat)
    : source_(std::move(source)), name_(std::move(name)) {
  try {
    program_ = parse(tokenize(source_, chat), uint32_t(source_.size()));
  } catch (const RenderError& e) {
    fail(e.message, e.pos, false);
  }
}

void Template::fail(const std::string& message, uint32_t pos, bool raised) const {
  const auto [line, col] = line_col(source_, pos == RenderError::kNoPos ? 0 : pos);
  throw TemplateError(
      fmt::format("{}:{}:{}: {}{}", name_, line, col, raised ? "raise_exception: " : "", message),
      message, raised);
}

std::string Template::render(const nlohmann::ordered_json& context, bool strict_undefined) const {
  auto globals = std::make_shared<Scope>();
  for (auto& [k, v] : builtin_globals()) globals->set(k, std::move(v));
  if (!context.is_null() && !context.is_object())
    throw Error(name_ + ": the variables to render with must be a JSON object");
  for (auto it = context.begin(); !context.is_null() && it != context.end(); ++it)
    globals->set(it.key(), Value::from_json(it.value()));
  try {
    Interpreter in;
    in.strict_undefined = strict_undefined;
    return in.run(program_, globals);
  } catch (const RenderError& e) {
    fail(e.message, e.pos, e.raised);
  }
}

}  // namespace nk::jinja
