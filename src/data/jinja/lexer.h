// Template source to tokens, as Hugging Face renders chat templates: Jinja
// with trim_blocks and lstrip_blocks (the settings apply_chat_template
// uses), the single trailing newline dropped, whitespace control ({%- -%}
// {{- -}} {#- -#}), and transformers' {% generation %} tags removed. The
// preprocessing is the reference's (@huggingface/jinja) done on the text
// before tokenizing, kept with a map back to the original offsets so every
// token knows its line and column.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace nk::jinja {

enum class Tok : uint8_t {
  Text,
  Number,
  String,
  Identifier,
  Equals,
  OpenParen,
  CloseParen,
  OpenStatement,
  CloseStatement,
  OpenExpression,
  CloseExpression,
  OpenSquare,
  CloseSquare,
  OpenCurly,
  CloseCurly,
  Comma,
  Dot,
  Colon,
  Pipe,
  Additive,        // + - ~
  Multiplicative,  // * / // %
  Exponent,        // **
  Comparison,      // < > <= >= == !=
  Unary,           // a sign before an operand: -x
  Comment
};

struct Token {
  Tok type;
  std::string value;  // the text, literal contents, operator or name
  uint32_t pos;       // byte offset of its start in the original source
};

// nk::jinja::RenderError (with a position) for a malformed token: an
// unterminated string or comment, an unknown escape, a stray character.
// chat = false: Python Jinja's Environment(keep_trailing_newline=True)
// instead (lm-evaluation-harness's task templates): no trim_blocks or
// lstrip_blocks, and the trailing newline kept.
std::vector<Token> tokenize(std::string_view source, bool chat = true);

// 1-based line and column (in bytes) of byte offset `pos` of `source`.
std::pair<int, int> line_col(std::string_view source, uint32_t pos);

}  // namespace nk::jinja
