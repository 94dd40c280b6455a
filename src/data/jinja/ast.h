// The parsed template: statements (text, {{ expression }}, {% if %}, {% for
// %}, {% set %}, {% macro %}, {% call %}, {% filter %}, break/continue) and
// expressions, one node type with the fields each kind uses.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/jinja/value.h"

namespace nk::jinja {

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Nodes = std::vector<NodePtr>;

enum class NodeKind : uint8_t {
  // statements
  Text,         // name: the text
  If,           // a: test; body; alt: else (an elif is an If inside alt)
  For,          // a: loop target (Identifier or Tuple); b: iterable (maybe Select); body; alt
  Set,          // a: target (Identifier, Tuple or Member); b: value, or body (block set)
  Macro,        // name; items: parameters (Identifier or Keyword); body
  CallBlock,    // a: the Call; items: caller parameters; body
  FilterBlock,  // a: the filter (Identifier or Call); body
  Break,
  Continue,
  Comment,
  // expressions
  Literal,     // value
  Identifier,  // name
  ListLit,     // items
  TupleLit,    // items
  DictLit,     // items: keys; alt: values
  Member,      // a: object; b: property (computed: any expression or Slice; else
               // Identifier or integer Literal); flag: computed
  Slice,       // a, b, c: start, stop, step (any may be null)
  Call,        // a: callee; items: arguments (expressions, Keyword, Spread, KwSpread)
  Keyword,     // name; a: value (a keyword argument, or a parameter default)
  Spread,      // a: *expr
  KwSpread,    // a: **expr
  Unary,       // name: "not", "-" or "+"; a
  Binary,      // name: the operator ("and", "in", "not in", "~", ...); a, b
  Filter,      // a: operand; b: the filter (Identifier or Call)
  Test,        // a: operand; name: the test; flag: negated (is not)
  Select,      // a: value; b: condition (`x if c` without else)
  Ternary,     // a: condition; b: if true; c: if false
};

struct Node {
  NodeKind kind;
  uint32_t pos = 0;  // byte offset in the source, for messages
  std::string name;
  Value value;
  NodePtr a, b, c;
  Nodes items, body, alt;
  bool flag = false;
};

inline NodePtr make_node(NodeKind k, uint32_t pos) {
  auto n = std::make_unique<Node>();
  n->kind = k;
  n->pos = pos;
  return n;
}

}  // namespace nk::jinja
