// The values a Jinja template computes with, as @huggingface/jinja (the
// JavaScript implementation Hugging Face renders chat templates with) has
// them: undefined and none, booleans, integers and floats, strings, lists
// (and tuples, which print and serialize differently), mappings in insertion
// order, namespaces (the one mutable kind) and callables.
//
// Lists, mappings and namespaces are shared, not copied: `==` between two of
// them is identity, as in the reference, so `message == messages[-1]` holds
// for the same message object only. Strings are shared too (templates pass
// message contents around a lot).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace nk::jinja {

struct Value;
struct CallArgs;

using Array = std::vector<Value>;

// A mapping (or a namespace) in insertion order. Chat templates' mappings are
// small (a message, a tool schema), so lookups are linear.
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  // Replaces the value of an existing key in place (a JS Map keeps the
  // first position), else appends.
  void set(std::string key, Value v);
};

// A callable: a built-in (bound to its receiver for methods), a macro, or
// the `caller` of a call block.
struct Function {
  std::string name;  // for messages
  std::function<Value(CallArgs&)> call;
};

struct Value {
  enum class Kind : uint8_t {
    Undefined,
    None,
    Bool,
    Int,
    Float,
    String,
    Array,
    Tuple,
    Object,
    Namespace,
    Function
  };
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::shared_ptr<const std::string> s;
  std::shared_ptr<const jinja::Array> a;
  std::shared_ptr<jinja::Object> o;  // Object (never changed) or Namespace (set ns.x = ...)
  std::shared_ptr<const jinja::Function> fn;

  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);  // a float
  static Value string(std::string v);
  static Value array(jinja::Array v);
  static Value tuple(jinja::Array v);
  static Value object(jinja::Object v);
  static Value name_space(jinja::Object v);
  static Value function(std::string name, std::function<Value(CallArgs&)> call);
  // JSON as the reference converts JavaScript values: a number with an
  // integral value is an integer, objects keep their key order.
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_int() const { return kind == Kind::Int; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float; }
  bool is_list() const { return kind == Kind::Array || kind == Kind::Tuple; }
  bool is_mapping() const { return kind == Kind::Object; }
  bool has_attributes() const { return kind == Kind::Object || kind == Kind::Namespace; }
  const std::string& str() const { return *s; }
  const jinja::Array& list() const { return *a; }
  const jinja::Object& map() const { return *o; }
  double as_double() const { return kind == Kind::Int ? double(i) : kind == Kind::Bool ? b : f; }
};

// Arguments of a call: positional, then keyword in the order given.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* keyword(std::string_view name) const;
};

// The reference's type names ("StringValue", ...), which its messages use.
const char* type_name(const Value& v);

// Python-like truth: empty strings, lists and mappings, 0, none and
// undefined are false; a namespace or a callable is true.
bool truthy(const Value& v);

// JavaScript's loose `==` between the values the reference compares
// (`a.value == b.value`): containers by identity, undefined == none,
// numbers, booleans and numeric strings by number.
bool loose_equal(const Value& a, const Value& b);
// JavaScript's `===` on the same: `in`, `unique` and the equalto test.
bool strict_equal(const Value& a, const Value& b);

// How a value prints in {{ }} (the reference's toString): integers as
// integers, integral floats with ".0", booleans as true/false, lists and
// mappings as JSON. nk::jinja::RenderError for what cannot print (a tuple).
std::string display(const Value& v);
// JavaScript's String(raw value), what `~` and `+` with a string use: 1.0
// prints "1", a list its items joined by commas.
std::string raw_string(const Value& v);

struct JsonOptions {
  int indent = 0;  // 0: none
  bool ensure_ascii = false;
  bool sort_keys = false;
  bool custom_separators = false;
  std::string item_sep, key_sep;  // with custom_separators
};
// The tojson filter as the reference writes it: Python's json.dumps layout
// (", " and ": ", or "," and ": " with an indent), JavaScript's number and
// string forms (no HTML escaping, non-ASCII kept unless ensure_ascii).
// undefined_as_null = false spells undefined "undefined" (how lists print).
std::string to_json(const Value& v, const JsonOptions& opt = {}, bool undefined_as_null = true);

}  // namespace nk::jinja
