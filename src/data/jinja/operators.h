// The binary and unary operators on values, with the reference's rules
// (@huggingface/jinja): arithmetic on numbers (an integer result unless a
// float is involved), `+` joining lists or, with a string on either side,
// texts; `~` joining texts; `in` on lists (===), strings (substring) and
// mappings (keys); comparisons < > <= >= on numbers only; `==` JavaScript's
// loose equality. `and`, `or` short-circuit in the interpreter.
#pragma once
#include <string_view>

#include "data/jinja/value.h"

namespace nk::jinja {

// RenderError for an operator that does not apply (naming both types).
Value binary_op(std::string_view op, const Value& left, const Value& right);
// "not", "-", "+".
Value unary_op(std::string_view op, const Value& v);

}  // namespace nk::jinja
