#include "data/jinja/value.h"

#include <algorithm>
#include <cmath>

#include "data/jinja/js_text.h"
#include "data/jinja/render_error.h"

namespace nk::jinja {
namespace {

using Kind = Value::Kind;

// An integral double as an integer when it fits (JavaScript has one number
// type; the reference calls a number an integer when Number.isInteger).
bool integral(double d) {
  return std::isfinite(d) && std::floor(d) == d && std::abs(d) < 9.2e18;
}

// FloatValue.toString: integral floats keep one decimal ("2.0").
std::string float_display(double f) {
  if (f == 0 && std::signbit(f)) return "-0.0";
  if (integral(f) && std::abs(f) < 1e21) return js_number(f) + ".0";
  return js_number(f);
}

void json_into(const Value& v, const JsonOptions& o, int depth, bool undef_null, std::string& out) {
  const std::string item_sep = o.custom_separators ? o.item_sep : o.indent ? "," : ", ";
  const std::string key_sep = o.custom_separators ? o.key_sep : ": ";
  const std::string pad = o.indent ? std::string(size_t(o.indent), ' ') : "";
  auto newline = [&](int d) {
    out += '\n';
    for (int k = 0; k < d; ++k) out += pad;
  };
  switch (v.kind) {
    case Kind::None:
      out += "null";
      return;
    case Kind::Undefined:
      out += undef_null ? "null" : "undefined";
      return;
    case Kind::Bool:
      out += v.b ? "true" : "false";
      return;
    case Kind::Int:
      out += std::to_string(v.i);
      return;
    case Kind::Float:
      out += std::isfinite(v.f) ? js_number(v.f) : "null";
      return;
    case Kind::String:
      json_quote(v.str(), o.ensure_ascii, out);
      return;
    case Kind::Array: {
      const Array& a = v.list();
      out += '[';
      for (size_t k = 0; k < a.size(); ++k) {
        if (k) out += item_sep;
        if (o.indent) newline(depth + 1);
        json_into(a[k], o, depth + 1, undef_null, out);
      }
      if (o.indent && !a.empty()) newline(depth);
      out += ']';
      return;
    }
    case Kind::Object:
    case Kind::Namespace: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.map().items) items.push_back(&kv);
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](const auto* x, const auto* y) {
          return locale_compare(x->first, y->first) < 0;
        });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += item_sep;
        if (o.indent) newline(depth + 1);
        json_quote(items[k]->first, o.ensure_ascii, out);
        out += key_sep;
        json_into(items[k]->second, o, depth + 1, undef_null, out);
      }
      if (o.indent && !items.empty()) newline(depth);
      out += '}';
      return;
    }
    default:
      render_fail("Cannot convert to JSON: {}", type_name(v));
  }
}

// The number a primitive stands for in a loose comparison.
double loose_number(const Value& v) {
  switch (v.kind) {
    case Kind::Bool:
      return v.b;
    case Kind::Int:
      return double(v.i);
    case Kind::Float:
      return v.f;
    default:
      return js_to_number(v.str());
  }
}

bool container(const Value& v) {
  return v.kind == Kind::Array || v.kind == Kind::Tuple || v.kind == Kind::Object ||
         v.kind == Kind::Namespace || v.kind == Kind::Function;
}

bool same_object(const Value& a, const Value& b) {
  if (a.kind == Kind::Function || b.kind == Kind::Function) return a.kind == b.kind && a.fn == b.fn;
  if (a.is_list() || b.is_list()) return a.is_list() && b.is_list() && a.a == b.a;
  return a.has_attributes() && b.has_attributes() && a.o == b.o;
}

}  // namespace

const Value* Object::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Object::set(std::string key, Value v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(std::move(key), std::move(v));
}

const Value* CallArgs::keyword(std::string_view name) const {
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}

Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::Bool;
  v.b = x;
  return v;
}

Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::Int;
  v.i = x;
  return v;
}

Value Value::number(double x) {
  Value v;
  v.kind = Kind::Float;
  v.f = x;
  return v;
}

Value Value::string(std::string x) {
  Value v;
  v.kind = Kind::String;
  v.s = std::make_shared<const std::string>(std::move(x));
  return v;
}

Value Value::array(jinja::Array x) {
  Value v;
  v.kind = Kind::Array;
  v.a = std::make_shared<const jinja::Array>(std::move(x));
  return v;
}

Value Value::tuple(jinja::Array x) {
  Value v = array(std::move(x));
  v.kind = Kind::Tuple;
  return v;
}

Value Value::object(jinja::Object x) {
  Value v;
  v.kind = Kind::Object;
  v.o = std::make_shared<jinja::Object>(std::move(x));
  return v;
}

Value Value::name_space(jinja::Object x) {
  Value v = object(std::move(x));
  v.kind = Kind::Namespace;
  return v;
}

Value Value::function(std::string name, std::function<Value(CallArgs&)> call) {
  Value v;
  v.kind = Kind::Function;
  v.fn = std::make_shared<const jinja::Function>(jinja::Function{std::move(name), std::move(call)});
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u <= uint64_t(INT64_MAX) ? integer(int64_t(u)) : number(double(u));
    }
    case nlohmann::ordered_json::value_t::number_float: {
      const double d = j.get<double>();
      return integral(d) ? integer(int64_t(d)) : number(d);
    }
    case nlohmann::ordered_json::value_t::string:
      return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      jinja::Array a;
      a.reserve(j.size());
      for (const auto& x : j) a.push_back(from_json(x));
      return array(std::move(a));
    }
    case nlohmann::ordered_json::value_t::object: {
      jinja::Object o;
      for (auto it = j.begin(); it != j.end(); ++it) o.set(it.key(), from_json(it.value()));
      return object(std::move(o));
    }
    default:
      return Value();  // binary / discarded: not in parsed JSON
  }
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return "UndefinedValue";
    case Kind::None:
      return "NullValue";
    case Kind::Bool:
      return "BooleanValue";
    case Kind::Int:
      return "IntegerValue";
    case Kind::Float:
      return "FloatValue";
    case Kind::String:
      return "StringValue";
    case Kind::Array:
      return "ArrayValue";
    case Kind::Tuple:
      return "TupleValue";
    case Kind::Object:
      return "ObjectValue";
    case Kind::Namespace:
      return "NamespaceValue";
    case Kind::Function:
      return "FunctionValue";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return v.b;
    case Kind::Int:
      return v.i != 0;
    case Kind::Float:
      return v.f != 0 && !std::isnan(v.f);
    case Kind::String:
      return !v.str().empty();
    case Kind::Array:
    case Kind::Tuple:
      return !v.list().empty();
    case Kind::Object:
      return !v.map().items.empty();
    case Kind::Namespace:
    case Kind::Function:
      return true;
  }
  return false;
}

bool loose_equal(const Value& a, const Value& b) {
  const bool a_nullish = a.is_undefined() || a.is_none(),
             b_nullish = b.is_undefined() || b.is_none();
  if (a_nullish || b_nullish) return a_nullish && b_nullish;
  if (container(a) || container(b)) return same_object(a, b);
  if (a.is_string() && b.is_string()) return a.str() == b.str();
  return loose_number(a) == loose_number(b);
}

bool strict_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_double() == b.as_double();
  if (container(a) || container(b)) return same_object(a, b);
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Bool:
      return a.b == b.b;
    case Kind::String:
      return a.str() == b.str();
    default:
      return true;  // undefined, none
  }
}

std::string display(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return "undefined";
    case Kind::None:
      return "null";
    case Kind::Bool:
      return v.b ? "true" : "false";
    case Kind::Int:
      return std::to_string(v.i);
    case Kind::Float:
      return float_display(v.f);
    case Kind::String:
      return v.str();
    case Kind::Array:
    case Kind::Tuple:
    case Kind::Object:
    case Kind::Namespace:
      return to_json(v, {}, false);
    case Kind::Function:
      return "function " + v.fn->name;
  }
  return "";
}

std::string raw_string(const Value& v) {
  switch (v.kind) {
    case Kind::Float:
      return js_number(v.f);
    case Kind::Array:
    case Kind::Tuple: {
      std::string out;
      for (size_t k = 0; k < v.list().size(); ++k) {
        if (k) out += ',';
        out += display(v.list()[k]);
      }
      return out;
    }
    case Kind::Object:
    case Kind::Namespace:
      return "[object Map]";
    default:
      return display(v);
  }
}

std::string to_json(const Value& v, const JsonOptions& opt, bool undefined_as_null) {
  std::string out;
  json_into(v, opt, 0, undefined_as_null, out);
  return out;
}

}  // namespace nk::jinja
