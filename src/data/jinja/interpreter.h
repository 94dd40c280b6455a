// Runs a parsed template over a context of variables, as the reference
// (@huggingface/jinja) evaluates it: scopes (a for loop has its own; if does
// not; a macro runs in a scope under its caller's), loop variables (index,
// index0, revindex, revindex0, first, last, length, previtem, nextitem),
// macros with defaults, varargs and kwargs, call blocks with caller(), set
// to names, tuples and namespace attributes, block set, filter blocks,
// break and continue.
//
// Bounded: a render stops with an error after kMaxSteps evaluation steps
// (a loop that does not end), at kMaxDepth nested evaluations (a macro that
// calls itself forever) and when a text grows past kMaxText bytes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/jinja/ast.h"

namespace nk::jinja {

// A scope's variables; templates set few per scope, so a list searched
// linearly beats a hash map here.
struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;
  const Value* find(const std::string& name) const;
  void set(const std::string& name, Value v);
};
using ScopePtr = std::shared_ptr<Scope>;

class Interpreter {
 public:
  // Far beyond a real chat template's needs (every node evaluated is a
  // step; building a list costs its length).
  static constexpr int64_t kMaxSteps = 5'000'000;
  static constexpr int kMaxDepth = 600;
  static constexpr size_t kMaxText = size_t(64) << 20;

  // The rendered text of `program`; `globals` holds the built-ins and the
  // context. RenderError (with a position) for anything that fails.
  std::string run(const Nodes& program, ScopePtr globals);

  // Printing an undefined value ({{ missing }}) is an error naming it, as
  // Python Jinja's StrictUndefined has it (lm-evaluation-harness's task
  // templates), instead of the reference's empty text.
  bool strict_undefined = false;

 private:
  enum class Flow { Normal, Break, Continue };
  struct Depth;

  Flow exec_block(const Nodes& nodes, const ScopePtr& scope, std::string& out);
  Flow exec(const Node& n, const ScopePtr& scope, std::string& out);
  void exec_for(const Node& n, const ScopePtr& scope, std::string& out);
  void exec_set(const Node& n, const ScopePtr& scope);
  Value eval(const Node& n, const ScopePtr& scope);
  Value eval_member(const Node& n, const ScopePtr& scope);
  Value eval_filter(const Value& operand, const Node& filter, const ScopePtr& scope);
  CallArgs eval_args(const Nodes& args, const ScopePtr& scope);
  Value call(const Value& fn, CallArgs& args, const ScopePtr& caller_scope);
  Value make_macro(const Node& n);
  void bind_parameters(const std::string& what, const Nodes& params, const Nodes& body,
                       CallArgs& args, const ScopePtr& scope);
  void append(std::string& out, const std::string& text) const;
  void step();

  int64_t steps_ = 0;
  int depth_ = 0;
  ScopePtr call_scope_;  // the scope a function is being called from
};

}  // namespace nk::jinja
