#include "data/jinja/interpreter.h"

#include <algorithm>
#include <cmath>

#include "data/jinja/builtins.h"
#include "data/jinja/js_text.h"
#include "data/jinja/operators.h"
#include "data/jinja/render_error.h"

namespace nk::jinja {
namespace {

using Kind = Value::Kind;

ScopePtr child(const ScopePtr& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

void set(const ScopePtr& scope, const std::string& name, Value v) {
  scope->set(name, std::move(v));
}

// utils.slice of the reference: Python's slicing, but for a negative step a
// stop of -1 means "before the first item".
template <typename T>
std::vector<T> slice(const std::vector<T>& a, const Value& start, const Value& stop,
                     const Value& step) {
  const int64_t n = int64_t(a.size());
  const int64_t st = step.is_undefined() ? 1 : step.i;
  const int64_t dir = st > 0 ? 1 : st < 0 ? -1 : 0;
  int64_t b = 0, e = 0;
  if (dir >= 0) {
    b = start.is_undefined() ? 0 : start.i;
    b = b < 0 ? std::max<int64_t>(n + b, 0) : std::min(b, n);
    e = stop.is_undefined() ? n : stop.i;
    e = e < 0 ? std::max<int64_t>(n + e, 0) : std::min(e, n);
  } else {
    b = start.is_undefined() ? n - 1 : start.i;
    b = b < 0 ? std::max<int64_t>(n + b, -1) : std::min(b, n - 1);
    e = stop.is_undefined() ? -1 : stop.i;
    e = e < -1 ? std::max<int64_t>(n + e, -1) : std::min(e, n - 1);
  }
  std::vector<T> out;
  if (dir == 0) return out;
  for (int64_t i = b; dir * i < dir * e; i += st) out.push_back(a[size_t(i)]);
  return out;
}

// Does the body read `kwargs` or `varargs`? Then a macro takes extra
// keyword or positional arguments into them.
void find_special(const Node* n, bool& kwargs, bool& varargs) {
  if (!n) return;
  if (n->kind == NodeKind::Identifier) {
    kwargs |= n->name == "kwargs";
    varargs |= n->name == "varargs";
  }
  if (n->kind == NodeKind::Member && !n->flag) {  // .name is not a variable
    find_special(n->a.get(), kwargs, varargs);
    return;
  }
  if (n->kind == NodeKind::Filter) {
    find_special(n->a.get(), kwargs, varargs);
    if (n->b && n->b->kind == NodeKind::Call)
      for (const auto& x : n->b->items) find_special(x.get(), kwargs, varargs);
    return;
  }
  find_special(n->a.get(), kwargs, varargs);
  find_special(n->b.get(), kwargs, varargs);
  find_special(n->c.get(), kwargs, varargs);
  for (const auto* list : {&n->items, &n->body, &n->alt})
    for (const auto& x : *list) find_special(x.get(), kwargs, varargs);
}

}  // namespace

const Value* Scope::find(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent.get())
    for (const auto& [k, v] : s->vars)
      if (k == name) return &v;
  return nullptr;
}

void Scope::set(const std::string& name, Value v) {
  for (auto& [k, old] : vars)
    if (k == name) {
      old = std::move(v);
      return;
    }
  vars.emplace_back(name, std::move(v));
}

struct Interpreter::Depth {
  explicit Depth(Interpreter& in) : in_(in) {
    if (++in_.depth_ > kMaxDepth)
      render_fail(
          "the template nests calls or blocks deeper than {} levels (a macro that calls itself "
          "without end?)",
          kMaxDepth);
  }
  ~Depth() { --in_.depth_; }
  Interpreter& in_;
};

void Interpreter::step() {
  if (++steps_ > kMaxSteps)
    render_fail("the template ran more than {} steps (a loop that does not end?)", kMaxSteps);
}

void Interpreter::append(std::string& out, const std::string& text) const {
  if (out.size() + text.size() > kMaxText)
    render_fail("the template's output grew past {} MiB", kMaxText >> 20);
  out += text;
}

std::string Interpreter::run(const Nodes& program, ScopePtr globals) {
  std::string out;
  exec_block(program, globals, out);
  return out;
}

Interpreter::Flow Interpreter::exec_block(const Nodes& nodes, const ScopePtr& scope,
                                          std::string& out) {
  for (const auto& n : nodes) {
    const Flow f = exec(*n, scope, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec(const Node& n, const ScopePtr& scope, std::string& out) {
  step();
  Depth d(*this);
  try {
    switch (n.kind) {
      case NodeKind::Text:
        append(out, n.name);
        return Flow::Normal;
      case NodeKind::Comment:
      case NodeKind::Macro:
        if (n.kind == NodeKind::Macro) set(scope, n.name, make_macro(n));
        return Flow::Normal;
      case NodeKind::If:
        return exec_block(truthy(eval(*n.a, scope)) ? n.body : n.alt, scope, out);
      case NodeKind::For:
        exec_for(n, scope, out);
        return Flow::Normal;
      case NodeKind::Set:
        exec_set(n, scope);
        return Flow::Normal;
      case NodeKind::Break:
        return Flow::Break;
      case NodeKind::Continue:
        return Flow::Continue;
      case NodeKind::CallBlock: {
        // caller() renders the block in a scope under the call's.
        const Node* block = &n;
        ScopePtr where = scope;
        Value caller = Value::function("caller", [this, block, where](CallArgs& a) {
          ScopePtr s = child(where);
          bind_parameters("None", block->items, block->body, a, s);
          std::string text;
          exec_block(block->body, s, text);
          return Value::string(std::move(text));
        });
        CallArgs args = eval_args(n.a->items, scope);
        const Value fn = eval(*n.a->a, scope);
        ScopePtr env = child(scope);
        set(env, "caller", caller);
        const Value v = call(fn, args, env);
        if (!v.is_none() && !v.is_undefined()) append(out, display(v));
        return Flow::Normal;
      }
      case NodeKind::FilterBlock: {
        std::string text;
        exec_block(n.body, scope, text);
        const Value v = eval_filter(Value::string(std::move(text)), *n.a, scope);
        if (!v.is_none() && !v.is_undefined()) append(out, display(v));
        return Flow::Normal;
      }
      default: {  // {{ expression }}
        const Value v = eval(n, scope);
        if (strict_undefined && v.is_undefined())
          render_fail("'{}' is undefined",
                      n.kind == NodeKind::Identifier ? n.name : std::string("the expression"));
        if (!v.is_none() && !v.is_undefined()) append(out, display(v));
        return Flow::Normal;
      }
    }
  } catch (RenderError& e) {
    if (e.pos == RenderError::kNoPos) e.pos = n.pos;
    throw;
  }
}

void Interpreter::exec_for(const Node& n, const ScopePtr& env, std::string& out) {
  ScopePtr scope = child(env);
  const Node* test = nullptr;
  Value iterable;
  if (n.b->kind == NodeKind::Select) {
    iterable = eval(*n.b->a, scope);
    test = n.b->b.get();
  } else {
    iterable = eval(*n.b, scope);
  }
  if (!iterable.is_list() && !iterable.is_mapping())
    render_fail("Expected iterable or object type in for loop: got {}", type_name(iterable));
  Array all;
  if (iterable.is_mapping())
    for (const auto& kv : iterable.map().items) all.push_back(Value::string(kv.first));
  const Array& source = iterable.is_mapping() ? all : iterable.list();

  const Node& target = *n.a;
  auto bind = [&](const ScopePtr& s, const Value& item) {
    if (target.kind == NodeKind::Identifier) {
      set(s, target.name, item);
      return;
    }
    if (item.kind != Kind::Array)
      render_fail("Cannot unpack non-iterable type: {}", type_name(item));
    if (item.list().size() != target.items.size())
      render_fail("Too {} items to unpack",
                  target.items.size() > item.list().size() ? "few" : "many");
    for (size_t k = 0; k < target.items.size(); ++k) {
      if (target.items[k]->kind != NodeKind::Identifier)
        render_fail("Cannot unpack to a non-name in a for loop");
      set(s, target.items[k]->name, item.list()[k]);
    }
  };
  std::vector<const Value*> items;
  for (const Value& item : source) {
    step();
    if (target.kind == NodeKind::TupleLit && item.kind != Kind::Array)
      render_fail("Cannot unpack non-iterable type: {}", type_name(item));
    if (test) {
      ScopePtr s = child(scope);
      bind(s, item);
      if (!truthy(eval(*test, s))) continue;
    }
    items.push_back(&item);
  }
  bool none_ran = true;
  const int64_t len = int64_t(items.size());
  std::string text;
  for (int64_t i = 0; i < len; ++i) {
    Object loop;
    loop.items = {{"index", Value::integer(i + 1)},
                  {"index0", Value::integer(i)},
                  {"revindex", Value::integer(len - i)},
                  {"revindex0", Value::integer(len - i - 1)},
                  {"first", Value::boolean(i == 0)},
                  {"last", Value::boolean(i == len - 1)},
                  {"length", Value::integer(len)},
                  {"previtem", i > 0 ? *items[size_t(i - 1)] : Value()},
                  {"nextitem", i < len - 1 ? *items[size_t(i + 1)] : Value()}};
    set(scope, "loop", Value::object(std::move(loop)));
    bind(scope, *items[size_t(i)]);
    // As in the reference, an iteration's text counts only when its body
    // ran to the end: break and continue drop what it wrote.
    text.clear();
    const Flow f = exec_block(n.body, scope, text);
    if (f == Flow::Break) break;
    if (f == Flow::Continue) continue;
    append(out, text);
    none_ran = false;
  }
  if (none_ran) exec_block(n.alt, scope, out);
}

void Interpreter::exec_set(const Node& n, const ScopePtr& scope) {
  Value rhs;
  if (n.b) {
    rhs = eval(*n.b, scope);
  } else {
    std::string text;
    exec_block(n.body, scope, text);
    rhs = Value::string(std::move(text));
  }
  const Node& target = *n.a;
  switch (target.kind) {
    case NodeKind::Identifier:
      set(scope, target.name, std::move(rhs));
      return;
    case NodeKind::TupleLit: {
      if (!rhs.is_list()) render_fail("Cannot unpack non-iterable type in set: {}", type_name(rhs));
      if (rhs.list().size() != target.items.size())
        render_fail("Too {} items to unpack in set",
                    target.items.size() > rhs.list().size() ? "few" : "many");
      for (size_t k = 0; k < target.items.size(); ++k) {
        if (target.items[k]->kind != NodeKind::Identifier)
          render_fail("Cannot unpack to a non-name in set");
        set(scope, target.items[k]->name, rhs.list()[k]);
      }
      return;
    }
    case NodeKind::Member: {
      const Value obj = eval(*target.a, scope);
      if (obj.kind != Kind::Namespace)
        render_fail("cannot assign attribute on non-namespace object");
      if (target.flag || target.b->kind != NodeKind::Identifier)
        render_fail("Cannot assign to member with non-identifier property");
      obj.o->set(target.b->name, std::move(rhs));
      return;
    }
    default:
      render_fail("Invalid left-hand side of a set statement");
  }
}

Value Interpreter::make_macro(const Node& n) {
  const Node* macro = &n;
  return Value::function(n.name, [this, macro](CallArgs& a) {
    ScopePtr s = child(call_scope_);
    bind_parameters("'" + macro->name + "'", macro->items, macro->body, a, s);
    std::string text;
    exec_block(macro->body, s, text);
    return Value::string(std::move(text));
  });
}

void Interpreter::bind_parameters(const std::string& what, const Nodes& params, const Nodes& body,
                                  CallArgs& a, const ScopePtr& scope) {
  bool want_kwargs = false, want_varargs = false;
  for (const auto& b : body) find_special(b.get(), want_kwargs, want_varargs);
  for (const auto& p : params)  // a parameter named so is not the extra arguments
    if (p->name == "kwargs" || p->name == "varargs")
      (p->name == "kwargs" ? want_kwargs : want_varargs) = false;
  std::vector<std::pair<std::string, Value>> kw = a.kw;
  std::vector<const Node*> pending;
  for (size_t i = 0; i < params.size(); ++i) {
    const Node& p = *params[i];
    Value v;
    bool given = i < a.pos.size();
    if (given) v = a.pos[i];
    if (!given)
      for (auto it = kw.begin(); it != kw.end(); ++it)
        if (it->first == p.name) {
          v = it->second;
          kw.erase(it);
          given = true;
          break;
        }
    if (!given && p.kind == NodeKind::Keyword) pending.push_back(&p);
    set(scope, p.name, std::move(v));
  }
  if (want_kwargs) {
    Object o;
    for (auto& [k, v] : kw) o.set(k, v);
    set(scope, "kwargs", Value::object(std::move(o)));
  } else if (!kw.empty()) {
    render_fail("macro {} takes no keyword argument '{}'", what, kw.front().first);
  }
  if (want_varargs) {
    Array rest;
    for (size_t i = params.size(); i < a.pos.size(); ++i) rest.push_back(a.pos[i]);
    set(scope, "varargs", Value::array(std::move(rest)));
  } else if (a.pos.size() > params.size()) {
    render_fail("macro {} takes not more than {} argument(s)", what, params.size());
  }
  for (const Node* p : pending) set(scope, p->name, eval(*p->a, scope));
}

Value Interpreter::call(const Value& fn, CallArgs& args, const ScopePtr& caller_scope) {
  if (fn.kind != Kind::Function)
    render_fail("Cannot call something that is not a function: got {}", type_name(fn));
  Depth d(*this);
  ScopePtr saved = std::move(call_scope_);
  call_scope_ = caller_scope;
  try {
    Value v = fn.fn->call(args);
    call_scope_ = std::move(saved);
    if (v.is_list()) steps_ += int64_t(v.list().size());  // range(): building it costs its length
    return v;
  } catch (...) {
    call_scope_ = std::move(saved);
    throw;
  }
}

CallArgs Interpreter::eval_args(const Nodes& args, const ScopePtr& scope) {
  CallArgs out;
  for (const auto& a : args) {  // every positional one first, as the reference
    if (a->kind == NodeKind::Spread) {
      const Value v = eval(*a->a, scope);
      if (!v.is_list()) render_fail("Cannot unpack non-iterable type: {}", type_name(v));
      for (const Value& x : v.list()) out.pos.push_back(x);
    } else if (a->kind != NodeKind::Keyword && a->kind != NodeKind::KwSpread) {
      out.pos.push_back(eval(*a, scope));
    }
  }
  auto add = [&](const std::string& k, Value v) {
    if (out.keyword(k)) render_fail("Got multiple values for keyword argument '{}'", k);
    out.kw.emplace_back(k, std::move(v));
  };
  for (const auto& a : args) {
    if (a->kind == NodeKind::Keyword) {
      add(a->name, eval(*a->a, scope));
    } else if (a->kind == NodeKind::KwSpread) {
      const Value v = eval(*a->a, scope);
      if (!v.is_mapping()) render_fail("Argument after ** must be a mapping, not {}", type_name(v));
      for (const auto& [k, x] : v.map().items) add(k, x);
    }
  }
  return out;
}

Value Interpreter::eval_filter(const Value& operand, const Node& f, const ScopePtr& scope) {
  if (f.kind == NodeKind::Identifier) return apply_filter(operand, f.name, nullptr, false);
  if (f.kind != NodeKind::Call || f.a->kind != NodeKind::Identifier)
    render_fail("Unknown filter: a filter is a name, or a name with arguments");
  bool literal = true;
  for (const auto& a : f.items) literal &= a->kind == NodeKind::Literal && a->value.is_string();
  CallArgs args = eval_args(f.items, scope);
  return apply_filter(operand, f.a->name, &args, literal);
}

Value Interpreter::eval_member(const Node& n, const ScopePtr& scope) {
  const Value obj = eval(*n.a, scope);
  const Node& p = *n.b;
  if (n.flag && p.kind == NodeKind::Slice) {
    if (!obj.is_list() && !obj.is_string()) render_fail("Slice object must be an array or string");
    Value parts[3];
    const Node* nodes[3] = {p.a.get(), p.b.get(), p.c.get()};
    const char* names[3] = {"start", "stop", "step"};
    for (int k = 0; k < 3; ++k) {
      if (nodes[k]) parts[k] = eval(*nodes[k], scope);
      if (!parts[k].is_int() && !parts[k].is_undefined())
        render_fail("Slice {} must be numeric or undefined", names[k]);
    }
    if (obj.is_list()) return Value::array(slice(obj.list(), parts[0], parts[1], parts[2]));
    std::string out;
    for (std::string_view c : slice(characters(obj.str()), parts[0], parts[1], parts[2])) out += c;
    return Value::string(std::move(out));
  }
  Value prop;
  if (n.flag)
    prop = eval(p, scope);
  else if (p.kind == NodeKind::Literal)
    prop = p.value;
  else
    prop = Value::string(p.name);
  if (obj.has_attributes()) {
    if (!prop.is_string())
      render_fail("Cannot access property with non-string: got {}", type_name(prop));
    if (const Value* v = obj.map().find(prop.str())) return *v;
    return obj.is_mapping() ? builtin_member(obj, prop.str()) : Value();
  }
  if (obj.is_list() || obj.is_string()) {
    if (prop.is_int()) {
      if (obj.is_list()) {
        const int64_t size = int64_t(obj.list().size());
        const int64_t k = prop.i < 0 ? size + prop.i : prop.i;
        return k >= 0 && k < size ? obj.list()[size_t(k)] : Value();
      }
      const auto chars = characters(obj.str());
      const int64_t size = int64_t(chars.size());
      const int64_t k = prop.i < 0 ? size + prop.i : prop.i;
      return k >= 0 && k < size ? Value::string(std::string(chars[size_t(k)])) : Value();
    }
    if (prop.is_string()) return builtin_member(obj, prop.str());
    render_fail("Cannot access property with non-string/non-number: got {}", type_name(prop));
  }
  if (!prop.is_string())
    render_fail("Cannot access property with non-string: got {}", type_name(prop));
  return Value();
}

Value Interpreter::eval(const Node& n, const ScopePtr& scope) {
  step();
  Depth d(*this);
  try {
    switch (n.kind) {
      case NodeKind::Literal:
        return n.value;
      case NodeKind::Identifier: {
        const Value* v = scope->find(n.name);
        return v ? *v : Value();
      }
      case NodeKind::ListLit:
      case NodeKind::TupleLit: {
        Array items;
        for (const auto& x : n.items) items.push_back(eval(*x, scope));
        return n.kind == NodeKind::ListLit ? Value::array(std::move(items))
                                           : Value::tuple(std::move(items));
      }
      case NodeKind::DictLit: {
        Object o;
        for (size_t k = 0; k < n.items.size(); ++k) {
          const Value key = eval(*n.items[k], scope);
          if (!key.is_string()) render_fail("Object keys must be strings: got {}", type_name(key));
          o.set(key.str(), eval(*n.alt[k], scope));
        }
        return Value::object(std::move(o));
      }
      case NodeKind::Member:
        return eval_member(n, scope);
      case NodeKind::Call: {
        CallArgs args = eval_args(n.items, scope);
        const Value fn = eval(*n.a, scope);
        return call(fn, args, scope);
      }
      case NodeKind::Unary:
        return unary_op(n.name, eval(*n.a, scope));
      case NodeKind::Binary: {
        Value l = eval(*n.a, scope);
        if (n.name == "and") return truthy(l) ? eval(*n.b, scope) : l;
        if (n.name == "or") return truthy(l) ? l : eval(*n.b, scope);
        Value v = binary_op(n.name, l, eval(*n.b, scope));
        if (v.is_string() && v.str().size() > kMaxText)
          render_fail("a text grew past {} MiB", kMaxText >> 20);
        if (v.is_list()) steps_ += int64_t(v.list().size());  // copying a list costs its length
        return v;
      }
      case NodeKind::Filter:
        return eval_filter(eval(*n.a, scope), *n.b, scope);
      case NodeKind::Test: {
        const Value v = eval(*n.a, scope);
        return Value::boolean(apply_test(n.name, v) != n.flag);
      }
      case NodeKind::Select:
        return truthy(eval(*n.b, scope)) ? eval(*n.a, scope) : Value();
      case NodeKind::Ternary:
        return truthy(eval(*n.a, scope)) ? eval(*n.b, scope) : eval(*n.c, scope);
      case NodeKind::Slice:
        render_fail("a slice is only valid inside [ ]");
      case NodeKind::Keyword:
      case NodeKind::Spread:
      case NodeKind::KwSpread:
        render_fail("keyword arguments and unpacking are only valid in a call");
      default:
        render_fail("a statement where a value was expected");
    }
  } catch (RenderError& e) {
    if (e.pos == RenderError::kNoPos) e.pos = n.pos;
    throw;
  }
}

}  // namespace nk::jinja
