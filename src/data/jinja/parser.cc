#include "data/jinja/parser.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <set>

#include "data/jinja/render_error.h"

namespace nk::jinja {
namespace {

// Deeper nesting than any template needs: an error, not a stack overflow.
constexpr int kMaxDepth = 200;

const char* tok_name(Tok t) {
  switch (t) {
    case Tok::Text:
      return "text";
    case Tok::Number:
      return "a number";
    case Tok::String:
      return "a string";
    case Tok::Identifier:
      return "a name";
    case Tok::Equals:
      return "'='";
    case Tok::OpenParen:
      return "'('";
    case Tok::CloseParen:
      return "')'";
    case Tok::OpenStatement:
      return "'{%'";
    case Tok::CloseStatement:
      return "'%}'";
    case Tok::OpenExpression:
      return "'{{'";
    case Tok::CloseExpression:
      return "'}}'";
    case Tok::OpenSquare:
      return "'['";
    case Tok::CloseSquare:
      return "']'";
    case Tok::OpenCurly:
      return "'{'";
    case Tok::CloseCurly:
      return "'}'";
    case Tok::Comma:
      return "','";
    case Tok::Dot:
      return "'.'";
    case Tok::Colon:
      return "':'";
    case Tok::Pipe:
      return "'|'";
    case Tok::Additive:
    case Tok::Multiplicative:
    case Tok::Exponent:
    case Tok::Comparison:
    case Tok::Unary:
      return "an operator";
    case Tok::Comment:
      return "a comment";
  }
  return "?";
}

class Parser {
 public:
  Parser(const std::vector<Token>& t, uint32_t end) : t_(t), end_(end) {}

  Nodes program() {
    Nodes out;
    while (i_ < t_.size()) out.push_back(any());
    return out;
  }

 private:
  struct Depth {
    explicit Depth(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxDepth)
        p_.error(fmt::format("the template nests deeper than {} levels", kMaxDepth));
    }
    ~Depth() { --p_.depth_; }
    Parser& p_;
  };

  uint32_t pos() const { return i_ < t_.size() ? t_[i_].pos : end_; }
  [[noreturn]] void error(const std::string& msg) const {
    throw RenderError{"syntax error: " + msg, pos()};
  }
  std::string found() const {
    if (i_ >= t_.size()) return "the end of the template";
    const Token& t = t_[i_];
    if (t.type == Tok::Identifier || t.type == Tok::Number || t.type == Tok::Comparison ||
        t.type == Tok::Additive || t.type == Tok::Multiplicative || t.type == Tok::Unary)
      return "'" + t.value + "'";
    return tok_name(t.type);
  }
  bool is(Tok t, size_t k = 0) const { return i_ + k < t_.size() && t_[i_ + k].type == t; }
  bool is_word(const char* w, size_t k = 0) const {
    return is(Tok::Identifier, k) && t_[i_ + k].value == w;
  }
  bool is_statement(std::initializer_list<const char*> names) const {
    if (!is(Tok::OpenStatement) || !is(Tok::Identifier, 1)) return false;
    return std::any_of(names.begin(), names.end(),
                       [&](const char* n) { return t_[i_ + 1].value == n; });
  }
  const Token& expect(Tok t, const char* what) {
    if (!is(t)) error(fmt::format("expected {}, found {}", what, found()));
    return t_[i_++];
  }
  void expect_word(const char* w) {
    if (!is_word(w)) error(fmt::format("expected '{}', found {}", w, found()));
    ++i_;
  }
  // Statements up to (not including) a {% NAME %} of `names`.
  Nodes block(std::initializer_list<const char*> names, const char* what) {
    Nodes out;
    while (!is_statement(names)) {
      if (i_ >= t_.size())
        error(fmt::format("the template ends inside {} (no {{% {} %}})", what, *names.begin()));
      out.push_back(any());
    }
    return out;
  }
  void end_tag(const char* name) {
    expect(Tok::OpenStatement, "'{%'");
    expect_word(name);
    expect(Tok::CloseStatement, "'%}'");
  }

  NodePtr any() {
    Depth d(*this);
    const Token& t = t_[i_];
    switch (t.type) {
      case Tok::Comment: {
        auto n = make_node(NodeKind::Comment, t.pos);
        ++i_;
        return n;
      }
      case Tok::Text: {
        auto n = make_node(NodeKind::Text, t.pos);
        n->name = t.value;
        ++i_;
        return n;
      }
      case Tok::OpenStatement:
        return statement();
      case Tok::OpenExpression: {
        ++i_;
        NodePtr e = expression();
        expect(Tok::CloseExpression, "'}}'");
        return e;
      }
      default:
        error(fmt::format("unexpected {}", found()));
    }
  }

  NodePtr statement() {
    ++i_;  // {%
    if (!is(Tok::Identifier)) error(fmt::format("expected a statement name, found {}", found()));
    const std::string name = t_[i_].value;
    const uint32_t at = t_[i_].pos;
    ++i_;
    if (name == "set") return set_statement(at);
    if (name == "if") {
      NodePtr n = if_statement(at);
      end_tag("endif");
      return n;
    }
    if (name == "for") {
      NodePtr n = for_statement(at);
      end_tag("endfor");
      return n;
    }
    if (name == "macro") {
      auto n = make_node(NodeKind::Macro, at);
      NodePtr callee = primary();
      if (callee->kind != NodeKind::Identifier) error("expected a macro name after 'macro'");
      n->name = callee->name;
      n->items = args(true);
      expect(Tok::CloseStatement, "'%}'");
      n->body = block({"endmacro"}, "a macro");
      end_tag("endmacro");
      return n;
    }
    if (name == "call") {
      auto n = make_node(NodeKind::CallBlock, at);
      if (is(Tok::OpenParen)) n->items = args(true);
      NodePtr callee = primary();
      if (callee->kind != NodeKind::Identifier) error("expected a macro name after 'call'");
      auto call = make_node(NodeKind::Call, callee->pos);
      call->a = std::move(callee);
      call->items = args(false);
      n->a = std::move(call);
      expect(Tok::CloseStatement, "'%}'");
      n->body = block({"endcall"}, "a call block");
      end_tag("endcall");
      return n;
    }
    if (name == "filter") {
      auto n = make_node(NodeKind::FilterBlock, at);
      NodePtr f = primary();
      if (f->kind == NodeKind::Identifier && is(Tok::OpenParen)) f = call(std::move(f));
      n->a = std::move(f);
      expect(Tok::CloseStatement, "'%}'");
      n->body = block({"endfilter"}, "a filter block");
      end_tag("endfilter");
      return n;
    }
    if (name == "break" || name == "continue") {
      expect(Tok::CloseStatement, "'%}'");
      return make_node(name == "break" ? NodeKind::Break : NodeKind::Continue, at);
    }
    --i_;
    error(fmt::format("unknown statement '{}'", name));
  }

  NodePtr set_statement(uint32_t at) {
    auto n = make_node(NodeKind::Set, at);
    n->a = sequence(false);
    if (is(Tok::Equals)) {
      ++i_;
      n->b = sequence(false);
    } else {
      expect(Tok::CloseStatement, "'=' or '%}'");
      n->body = block({"endset"}, "a set block");
      expect(Tok::OpenStatement, "'{%'");
      expect_word("endset");
    }
    expect(Tok::CloseStatement, "'%}'");
    return n;
  }

  NodePtr if_statement(uint32_t at) {
    Depth d(*this);
    auto n = make_node(NodeKind::If, at);
    n->a = expression();
    expect(Tok::CloseStatement, "'%}'");
    n->body = block({"elif", "else", "endif"}, "an if block");
    if (is_statement({"elif"})) {
      const uint32_t elif_at = t_[i_ + 1].pos;
      i_ += 2;
      n->alt.push_back(if_statement(elif_at));
    } else if (is_statement({"else"})) {
      i_ += 2;
      expect(Tok::CloseStatement, "'%}'");
      n->alt = block({"endif"}, "an else block");
    }
    return n;
  }

  NodePtr for_statement(uint32_t at) {
    auto n = make_node(NodeKind::For, at);
    n->a = sequence(true);
    if (n->a->kind != NodeKind::Identifier && n->a->kind != NodeKind::TupleLit)
      error("expected a name or names for the loop variable");
    expect_word("in");
    n->b = expression();
    expect(Tok::CloseStatement, "'%}'");
    n->body = block({"endfor", "else"}, "a for loop");
    if (is_statement({"else"})) {
      i_ += 2;
      expect(Tok::CloseStatement, "'%}'");
      n->alt = block({"endfor"}, "a for loop's else block");
    }
    return n;
  }

  // One expression, or several separated by commas: a tuple.
  NodePtr sequence(bool primary_only) {
    const uint32_t at = pos();
    NodePtr first = primary_only ? primary() : expression();
    if (!is(Tok::Comma)) return first;
    auto t = make_node(NodeKind::TupleLit, at);
    t->items.push_back(std::move(first));
    while (is(Tok::Comma)) {
      ++i_;
      t->items.push_back(primary_only ? primary() : expression());
    }
    return t;
  }

  NodePtr expression() {
    Depth d(*this);
    NodePtr a = logical_or();
    if (!is_word("if")) return a;
    const uint32_t at = t_[i_].pos;
    ++i_;
    NodePtr test = logical_or();
    if (is_word("else")) {
      ++i_;
      auto n = make_node(NodeKind::Ternary, at);
      n->a = std::move(test);
      n->b = std::move(a);
      n->c = expression();
      return n;
    }
    auto n = make_node(NodeKind::Select, at);
    n->a = std::move(a);
    n->b = std::move(test);
    return n;
  }

  NodePtr binary(std::string op, uint32_t at, NodePtr l, NodePtr r) {
    auto n = make_node(NodeKind::Binary, at);
    n->name = std::move(op);
    n->a = std::move(l);
    n->b = std::move(r);
    return n;
  }

  NodePtr logical_or() {
    NodePtr left = logical_and();
    while (is_word("or")) {
      const uint32_t at = t_[i_++].pos;
      left = binary("or", at, std::move(left), logical_and());
    }
    return left;
  }

  NodePtr logical_and() {
    NodePtr left = logical_not();
    while (is_word("and")) {
      const uint32_t at = t_[i_++].pos;
      left = binary("and", at, std::move(left), logical_not());
    }
    return left;
  }

  NodePtr logical_not() {
    if (!is_word("not")) return comparison();
    Depth d(*this);
    auto n = make_node(NodeKind::Unary, t_[i_].pos);
    n->name = "not";
    ++i_;
    n->a = logical_not();
    return n;
  }

  NodePtr comparison() {
    NodePtr left = additive();
    while (true) {
      std::string op;
      const uint32_t at = pos();
      if (is_word("not") && is_word("in", 1)) {
        op = "not in";
        i_ += 2;
      } else if (is_word("in")) {
        op = "in";
        ++i_;
      } else if (is(Tok::Comparison)) {
        op = t_[i_++].value;
      } else {
        return left;
      }
      left = binary(op, at, std::move(left), additive());
    }
  }

  NodePtr additive() {
    NodePtr left = multiplicative();
    while (is(Tok::Additive)) {
      const Token& t = t_[i_++];
      left = binary(t.value, t.pos, std::move(left), multiplicative());
    }
    return left;
  }

  NodePtr multiplicative() {
    NodePtr left = power();
    while (is(Tok::Multiplicative)) {
      const Token& t = t_[i_++];
      left = binary(t.value, t.pos, std::move(left), power());
    }
    return left;
  }

  NodePtr power() {
    NodePtr left = test();
    while (is(Tok::Exponent)) {
      const Token& t = t_[i_++];
      left = binary(t.value, t.pos, std::move(left), test());
    }
    return left;
  }

  NodePtr test() {
    NodePtr operand = filter();
    while (is_word("is")) {
      const uint32_t at = t_[i_++].pos;
      auto n = make_node(NodeKind::Test, at);
      if (is_word("not")) {
        n->flag = true;
        ++i_;
      }
      NodePtr name = primary();
      if (name->kind != NodeKind::Identifier) error("expected a test name after 'is'");
      n->name = name->name;
      n->a = std::move(operand);
      operand = std::move(n);
    }
    return operand;
  }

  NodePtr filter() {
    NodePtr operand = unary_sign();
    while (is(Tok::Pipe)) {
      const uint32_t at = t_[i_++].pos;
      NodePtr f = primary();
      if (f->kind != NodeKind::Identifier) error("expected a filter name after '|'");
      if (is(Tok::OpenParen)) f = call(std::move(f));
      auto n = make_node(NodeKind::Filter, at);
      n->a = std::move(operand);
      n->b = std::move(f);
      operand = std::move(n);
    }
    return operand;
  }

  NodePtr unary_sign() {
    if ((is(Tok::Unary) || is(Tok::Additive)) && (t_[i_].value == "-" || t_[i_].value == "+")) {
      Depth d(*this);
      auto n = make_node(NodeKind::Unary, t_[i_].pos);
      n->name = t_[i_++].value;
      n->a = unary_sign();
      return n;
    }
    NodePtr member = members(primary());
    return is(Tok::OpenParen) ? call(std::move(member)) : std::move(member);
  }

  NodePtr call(NodePtr callee) {
    Depth d(*this);
    auto n = make_node(NodeKind::Call, callee->pos);
    n->a = std::move(callee);
    n->items = args(false);
    NodePtr e = members(std::move(n));
    return is(Tok::OpenParen) ? call(std::move(e)) : std::move(e);
  }

  // (a, b=1, *rest, **more); parameters: names and name=default only.
  Nodes args(bool parameters) {
    expect(Tok::OpenParen, "'('");
    Nodes out;
    std::set<std::string> names;
    bool saw_keyword = false, saw_spread = false;
    while (!is(Tok::CloseParen)) {
      if (i_ >= t_.size()) error("the template ends inside an argument list");
      const uint32_t at = pos();
      const bool kw_spread = is(Tok::Exponent);
      const bool spread = is(Tok::Multiplicative) && t_[i_].value == "*";
      if (parameters && (kw_spread || spread))
        error("argument unpacking is not allowed in parameter declarations");
      if (kw_spread) {
        ++i_;
        auto n = make_node(NodeKind::KwSpread, at);
        n->a = expression();
        out.push_back(std::move(n));
        if (is(Tok::Comma)) ++i_;
        if (!is(Tok::CloseParen)) error("'**' must be applied to the last argument");
        break;
      }
      NodePtr arg;
      if (spread) {
        if (saw_spread) error("only one '*' argument unpacking is allowed");
        saw_spread = true;
        ++i_;
        arg = make_node(NodeKind::Spread, at);
        arg->a = expression();
      } else {
        arg = expression();
        if (is(Tok::Equals)) {
          ++i_;
          if (arg->kind != NodeKind::Identifier)
            error(parameters ? "expected a name for a parameter"
                             : "expected a name for a keyword argument");
          auto kw = make_node(NodeKind::Keyword, arg->pos);
          kw->name = arg->name;
          kw->a = expression();
          arg = std::move(kw);
        }
        if (parameters) {
          if (arg->kind != NodeKind::Identifier && arg->kind != NodeKind::Keyword)
            error("expected a name for a parameter");
          if (!names.insert(arg->name).second)
            error(fmt::format("duplicate parameter '{}'", arg->name));
        }
        if (arg->kind == NodeKind::Keyword)
          saw_keyword = true;
        else if (saw_keyword)
          error(parameters ? "a parameter without a default follows one with a default"
                           : "positional arguments must come before keyword arguments");
        else if (saw_spread)
          error("positional arguments must not follow '*' argument unpacking");
      }
      out.push_back(std::move(arg));
      if (is(Tok::Comma)) ++i_;
    }
    ++i_;  // )
    return out;
  }

  // [i], [a:b:c] (each part optional).
  NodePtr subscript() {
    std::vector<NodePtr> parts;
    bool slice = false;
    const uint32_t at = pos();
    while (!is(Tok::CloseSquare)) {
      if (i_ >= t_.size()) error("the template ends inside '['");
      if (is(Tok::Colon)) {
        parts.push_back(nullptr);
        ++i_;
        slice = true;
      } else {
        parts.push_back(expression());
        if (is(Tok::Colon)) {
          ++i_;
          slice = true;
        }
      }
    }
    if (parts.empty()) error("expected an index or a slice inside '[]'");
    if (!slice) return std::move(parts[0]);
    if (parts.size() > 3) error("a slice has at most three parts (start:stop:step)");
    auto n = make_node(NodeKind::Slice, at);
    parts.resize(3);
    n->a = std::move(parts[0]);
    n->b = std::move(parts[1]);
    n->c = std::move(parts[2]);
    return n;
  }

  NodePtr members(NodePtr object) {
    while (is(Tok::Dot) || is(Tok::OpenSquare)) {
      const bool computed = is(Tok::OpenSquare);
      auto n = make_node(NodeKind::Member, t_[i_].pos);
      ++i_;
      if (computed) {
        n->b = subscript();
        expect(Tok::CloseSquare, "']'");
      } else {
        n->b = primary();
        if (n->b->kind != NodeKind::Identifier &&
            !(n->b->kind == NodeKind::Literal && n->b->value.is_int()))
          error("expected a name or an integer after '.'");
      }
      n->flag = computed;
      n->a = std::move(object);
      object = std::move(n);
    }
    return object;
  }

  NodePtr number(const Token& t) {
    auto n = make_node(NodeKind::Literal, t.pos);
    if (t.value.find('.') != std::string::npos) {
      n->value = Value::number(std::strtod(t.value.c_str(), nullptr));
    } else {
      errno = 0;
      const long long v = std::strtoll(t.value.c_str(), nullptr, 10);
      n->value = errno == ERANGE ? Value::number(std::strtod(t.value.c_str(), nullptr))
                                 : Value::integer(v);
    }
    return n;
  }

  NodePtr primary() {
    if (i_ >= t_.size()) error("unexpected end of the template: expected a value");
    Depth d(*this);
    const Token& t = t_[i_++];
    switch (t.type) {
      case Tok::Number:
        return number(t);
      case Tok::String: {
        auto n = make_node(NodeKind::Literal, t.pos);
        std::string s = t.value;
        while (is(Tok::String)) s += t_[i_++].value;  // 'a' 'b' is 'ab'
        n->value = Value::string(std::move(s));
        return n;
      }
      case Tok::Identifier: {
        auto n = make_node(NodeKind::Identifier, t.pos);
        n->name = t.value;
        return n;
      }
      case Tok::OpenParen: {
        NodePtr e = sequence(false);
        expect(Tok::CloseParen, "')'");
        return e;
      }
      case Tok::OpenSquare: {
        auto n = make_node(NodeKind::ListLit, t.pos);
        while (!is(Tok::CloseSquare)) {
          if (i_ >= t_.size()) error("the template ends inside a list '['");
          n->items.push_back(expression());
          if (is(Tok::Comma)) ++i_;
        }
        ++i_;
        return n;
      }
      case Tok::OpenCurly: {
        auto n = make_node(NodeKind::DictLit, t.pos);
        while (!is(Tok::CloseCurly)) {
          if (i_ >= t_.size()) error("the template ends inside a mapping '{'");
          n->items.push_back(expression());
          expect(Tok::Colon, "':' between a key and its value");
          n->alt.push_back(expression());
          if (is(Tok::Comma)) ++i_;
        }
        ++i_;
        return n;
      }
      default:
        --i_;
        error(fmt::format("unexpected {}", found()));
    }
  }

  const std::vector<Token>& t_;
  uint32_t end_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

Nodes parse(const std::vector<Token>& tokens, uint32_t end_pos) {
  return Parser(tokens, end_pos).program();
}

}  // namespace nk::jinja
