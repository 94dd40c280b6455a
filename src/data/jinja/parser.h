// Tokens to the statement list of a template, with the reference's grammar
// and precedence (@huggingface/jinja): from loosest to tightest
//   a if c else b | x if c (a select) ; or ; and ; not ; comparisons and
//   (not) in, left to right ; + - ~ ; * / // % ; ** ; is (not) TEST ;
//   | filter ; unary - + ; calls, .attr and [subscript / slice] ; literals.
#pragma once
#include <vector>

#include "data/jinja/ast.h"
#include "data/jinja/lexer.h"

namespace nk::jinja {

// nk::jinja::RenderError with the position of the token the syntax error is
// found at (or the end of the source); nesting deeper than a bound is an
// error too, never a stack overflow.
Nodes parse(const std::vector<Token>& tokens, uint32_t end_pos);

}  // namespace nk::jinja
