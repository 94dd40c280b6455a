#include "data/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>

#include "data/jinja/js_text.h"
#include "data/jinja/render_error.h"

namespace nk::jinja {
namespace {

using Kind = Value::Kind;

// Longest list range() builds: a loop over it is bounded by the step limit
// anyway, this keeps the list itself from taking all memory first.
constexpr double kMaxRange = 1e6;

const Value* arg(const CallArgs& a, size_t i, const char* kw = nullptr) {
  if (i < a.pos.size()) return &a.pos[i];
  return kw ? a.keyword(kw) : nullptr;
}

Value str(std::string s) {
  return Value::string(std::move(s));
}

// Python's str.split(sep=None, maxsplit=-1) as the reference has it.
Value split(const std::string& s, const CallArgs& a) {
  const Value* sep = arg(a, 0);
  const Value* max = arg(a, 1);
  if (sep && !sep->is_string() && !sep->is_none())
    render_fail("sep argument must be a string or null");
  if (max && !max->is_int()) render_fail("maxsplit argument must be a number");
  const int64_t maxsplit = max ? max->i : -1;
  Array out;
  if (!sep || sep->is_none()) {
    const std::string_view t = trim_start(s);
    size_t i = 0;
    while (i < t.size()) {
      const size_t from = i;
      while (i < t.size() && space_at(t, i) == 0) ++i;
      if (maxsplit != -1 && int64_t(out.size()) >= maxsplit) {
        out.push_back(str(std::string(t.substr(from))));
        break;
      }
      out.push_back(str(std::string(t.substr(from, i - from))));
      while (i < t.size() && space_at(t, i) > 0) i += space_at(t, i);
    }
    return Value::array(std::move(out));
  }
  const std::string& d = sep->str();
  if (d.empty()) render_fail("empty separator");
  std::vector<std::string> parts;
  size_t at = 0;
  for (size_t next; (next = s.find(d, at)) != std::string::npos; at = next + d.size())
    parts.push_back(s.substr(at, next - at));
  parts.push_back(s.substr(at));
  if (maxsplit != -1 && int64_t(parts.size()) > maxsplit) {
    std::string rest;
    for (size_t k = size_t(maxsplit); k < parts.size(); ++k)
      rest += (k > size_t(maxsplit) ? d : "") + parts[k];
    parts.resize(size_t(maxsplit));
    parts.push_back(rest);
  }
  for (auto& p : parts) out.push_back(str(std::move(p)));
  return Value::array(std::move(out));
}

// Python's str.replace(old, new, count=-1); an empty `old` goes between
// every character.
Value replace(const std::string& s, const CallArgs& a) {
  if (a.pos.size() < 2) render_fail("replace() requires at least two arguments");
  if (!a.pos[0].is_string() || !a.pos[1].is_string())
    render_fail("replace() arguments must be strings");
  const Value* count = a.pos.size() > 2 ? &a.pos[2] : a.keyword("count");
  if (count && !count->is_int() && !count->is_none())
    render_fail("replace() count argument must be a number or null");
  int64_t left = count && count->is_int() && count->i >= 0 ? count->i : INT64_MAX;
  const std::string &from = a.pos[0].str(), &to = a.pos[1].str();
  std::string out;
  if (from.empty()) {
    for (std::string_view c : characters(s)) {
      if (left > 0) out += to, --left;
      out += c;
    }
    if (left > 0) out += to;
    return str(std::move(out));
  }
  size_t at = 0;
  for (size_t next; left > 0 && (next = s.find(from, at)) != std::string::npos; --left) {
    out += s.substr(at, next - at) + to;
    at = next + from.size();
  }
  return str(out + s.substr(at));
}

Value affix_test(const std::string& s, const CallArgs& a, bool prefix, const char* name) {
  if (a.pos.empty()) render_fail("{}() requires at least one argument", name);
  auto has = [&](const std::string& p) { return prefix ? s.starts_with(p) : s.ends_with(p); };
  const Value& p = a.pos[0];
  if (p.is_string()) return Value::boolean(has(p.str()));
  if (p.is_list()) {
    for (const Value& x : p.list()) {
      if (!x.is_string()) render_fail("{}() tuple elements must be strings", name);
      if (has(x.str())) return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  render_fail("{}() argument must be a string or tuple of strings", name);
}

Value string_member(const Value& v, const std::string& name) {
  const std::shared_ptr<const std::string> s = v.s;
  auto method = [&](std::function<Value(const std::string&, CallArgs&)> f) {
    return Value::function(name, [s, f](CallArgs& a) { return f(*s, a); });
  };
  if (name == "length") return Value::integer(int64_t(utf16_length(*s)));
  if (name == "upper")
    return method([](const std::string& x, CallArgs&) { return str(to_upper(x)); });
  if (name == "lower")
    return method([](const std::string& x, CallArgs&) { return str(to_lower(x)); });
  if (name == "strip")
    return method([](const std::string& x, CallArgs&) { return str(std::string(trim(x))); });
  if (name == "lstrip")
    return method([](const std::string& x, CallArgs&) { return str(std::string(trim_start(x))); });
  if (name == "rstrip")
    return method([](const std::string& x, CallArgs&) { return str(std::string(trim_end(x))); });
  if (name == "title")
    return method([](const std::string& x, CallArgs&) { return str(title_case(x)); });
  if (name == "capitalize")
    return method([](const std::string& x, CallArgs&) { return str(capitalize(x)); });
  if (name == "startswith")
    return method(
        [](const std::string& x, CallArgs& a) { return affix_test(x, a, true, "startswith"); });
  if (name == "endswith")
    return method(
        [](const std::string& x, CallArgs& a) { return affix_test(x, a, false, "endswith"); });
  if (name == "split") return method([](const std::string& x, CallArgs& a) { return split(x, a); });
  if (name == "replace")
    return method([](const std::string& x, CallArgs& a) { return replace(x, a); });
  return Value();
}

// The reference's order for sort and dictsort: numbers (and booleans) by
// value, strings (case-folded unless case_sensitive), none with none only.
int compare(const Value& a, const Value& b, bool case_sensitive) {
  if (a.is_none() && b.is_none()) return 0;
  if (a.is_none() || b.is_none())
    render_fail("Cannot compare {} with {}", type_name(a), type_name(b));
  if (a.is_undefined() && b.is_undefined()) return 0;
  if (a.is_undefined() || b.is_undefined())
    render_fail("Cannot compare {} with {}", type_name(a), type_name(b));
  auto numeric = [](const Value& v) { return v.is_number() || v.kind == Kind::Bool; };
  if (numeric(a) && numeric(b)) {
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.kind != b.kind)
    render_fail("Cannot compare different types: {} and {}", type_name(a), type_name(b));
  if (!a.is_string()) render_fail("Cannot compare type: {}", type_name(a));
  const std::string x = case_sensitive ? a.str() : to_lower(a.str());
  const std::string y = case_sensitive ? b.str() : to_lower(b.str());
  return x < y ? -1 : x > y ? 1 : 0;
}

Value items_of(const Value& v) {
  Array out;
  for (const auto& [k, x] : v.map().items) out.push_back(Value::array({str(k), x}));
  return Value::array(std::move(out));
}

Value dictsort(const Value& v, const CallArgs& a) {
  const Value* cs = arg(a, 0, "case_sensitive");
  const Value* by = arg(a, 1, "by");
  const Value* rev = arg(a, 2, "reverse");
  if (cs && cs->kind != Kind::Bool) render_fail("case_sensitive must be a boolean");
  if (by && !by->is_string()) render_fail("by must be a string");
  if (by && by->str() != "key" && by->str() != "value")
    render_fail("by must be either 'key' or 'value'");
  if (rev && rev->kind != Kind::Bool) render_fail("reverse must be a boolean");
  const size_t index = by && by->str() == "value" ? 1 : 0;
  const bool case_sensitive = cs && cs->b, reverse = rev && rev->b;
  Array items = items_of(v).list();
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    const int c = compare(x.list()[index], y.list()[index], case_sensitive);
    return reverse ? c > 0 : c < 0;
  });
  return Value::array(std::move(items));
}

Value object_member(const Value& v, const std::string& name) {
  const Value self = v;
  if (name == "get")
    return Value::function(name, [self](CallArgs& a) {
      const Value* key = arg(a, 0);
      if (!key || !key->is_string())
        render_fail("Object key must be a string: got {}",
                    key ? type_name(*key) : "UndefinedValue");
      if (const Value* x = self.map().find(key->str())) return *x;
      return a.pos.size() > 1 ? a.pos[1] : Value::none();
    });
  if (name == "items") return Value::function(name, [self](CallArgs&) { return items_of(self); });
  if (name == "keys")
    return Value::function(name, [self](CallArgs&) {
      Array out;
      for (const auto& kv : self.map().items) out.push_back(str(kv.first));
      return Value::array(std::move(out));
    });
  if (name == "values")
    return Value::function(name, [self](CallArgs&) {
      Array out;
      for (const auto& kv : self.map().items) out.push_back(kv.second);
      return Value::array(std::move(out));
    });
  if (name == "dictsort")
    return Value::function(name, [self](CallArgs& a) { return dictsort(self, a); });
  return Value();
}

// item.a.b (and list indices "0") for sort(attribute=) and map(attribute=).
Value attribute_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t at = 0;
  while (true) {
    const size_t dot = path.find('.', at);
    const std::string part =
        path.substr(at, dot == std::string::npos ? std::string::npos : dot - at);
    if (v.has_attributes()) {
      const Value* x = v.map().find(part);
      v = x ? *x : Value();
    } else if (v.is_list()) {
      char* end = nullptr;
      const long idx = std::strtol(part.c_str(), &end, 10);
      if (end == part.c_str() || idx < 0 || size_t(idx) >= v.list().size()) return Value();
      v = v.list()[size_t(idx)];
    } else {
      return Value();
    }
    if (dot == std::string::npos) return v;
    at = dot + 1;
  }
}

JsonOptions json_options(const CallArgs& a) {
  JsonOptions o;
  if (const Value* x = a.keyword("indent")) {
    if (!x->is_int() && !x->is_none()) render_fail("If set, indent must be a number");
    if (x->is_int()) {
      if (x->i < 0 || x->i > 64) render_fail("tojson: indent must be in [0, 64], got {}", x->i);
      o.indent = int(x->i);
    }
  }
  if (const Value* x = a.keyword("ensure_ascii")) {
    if (x->kind != Kind::Bool) render_fail("If set, ensure_ascii must be a boolean");
    o.ensure_ascii = x->b;
  }
  if (const Value* x = a.keyword("sort_keys")) {
    if (x->kind != Kind::Bool) render_fail("If set, sort_keys must be a boolean");
    o.sort_keys = x->b;
  }
  if (const Value* x = a.keyword("separators"); x && !x->is_none()) {
    if (!x->is_list()) render_fail("If set, separators must be a tuple of two strings");
    if (x->list().size() != 2 || !x->list()[0].is_string() || !x->list()[1].is_string())
      render_fail("separators must be a tuple of two strings");
    o.custom_separators = true;
    o.item_sep = x->list()[0].str();
    o.key_sep = x->list()[1].str();
  }
  return o;
}

// Array.prototype.join over the items' raw values: none and undefined are "".
std::string join(const Array& items, const std::string& sep) {
  std::string out;
  for (size_t k = 0; k < items.size(); ++k) {
    if (k) out += sep;
    if (!items[k].is_none() && !items[k].is_undefined()) out += raw_string(items[k]);
  }
  return out;
}

std::string indent(const std::string& s, const std::string& pad, bool first, bool blank) {
  std::string out;
  size_t at = 0, line = 0;
  while (true) {
    const size_t nl = s.find('\n', at);
    const std::string l = s.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
    if (!((!first && line == 0) || (!blank && l.empty()))) out += pad;
    out += l;
    if (nl == std::string::npos) return out;
    out += '\n';
    at = nl + 1;
    ++line;
  }
}

Value to_int(double d) {
  if (!std::isfinite(d) || std::abs(d) >= 9.2e18) return Value::number(d);
  return Value::integer(int64_t(d));
}

[[noreturn]] void cannot_apply(const std::string& name, const Value& v) {
  render_fail("Cannot apply filter \"{}\" to type: {}", name, type_name(v));
}

using TestFn = bool (*)(const Value&, const Value*);

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> t = {
      {"boolean", [](const Value& v, const Value*) { return v.kind == Kind::Bool; }},
      {"callable", [](const Value& v, const Value*) { return v.kind == Kind::Function; }},
      {"odd",
       [](const Value& v, const Value*) {
         if (!v.is_int()) render_fail("cannot odd on {}", type_name(v));
         return v.i % 2 != 0;
       }},
      {"even",
       [](const Value& v, const Value*) {
         if (!v.is_int()) render_fail("cannot even on {}", type_name(v));
         return v.i % 2 == 0;
       }},
      {"false", [](const Value& v, const Value*) { return v.kind == Kind::Bool && !v.b; }},
      {"true", [](const Value& v, const Value*) { return v.kind == Kind::Bool && v.b; }},
      {"none", [](const Value& v, const Value*) { return v.is_none(); }},
      {"string", [](const Value& v, const Value*) { return v.is_string(); }},
      {"number", [](const Value& v, const Value*) { return v.is_number(); }},
      {"integer", [](const Value& v, const Value*) { return v.is_int(); }},
      {"iterable",
       [](const Value& v, const Value*) { return v.kind == Kind::Array || v.is_string(); }},
      {"mapping", [](const Value& v, const Value*) { return v.is_mapping(); }},
      {"sequence",
       [](const Value& v, const Value*) { return v.is_list() || v.is_mapping() || v.is_string(); }},
      {"lower",
       [](const Value& v, const Value*) { return v.is_string() && v.str() == to_lower(v.str()); }},
      {"upper",
       [](const Value& v, const Value*) { return v.is_string() && v.str() == to_upper(v.str()); }},
      {"defined", [](const Value& v, const Value*) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, const Value*) { return v.is_undefined(); }},
      {"equalto",
       [](const Value& v, const Value* other) {
         if (!other) render_fail("the test 'equalto' needs a value to compare with");
         return strict_equal(v, *other);
       }},
      {"eq",
       [](const Value& v, const Value* other) {
         if (!other) render_fail("the test 'eq' needs a value to compare with");
         return strict_equal(v, *other);
       }},
  };
  return t;
}

TestFn find_test(const std::string& name) {
  const auto it = tests().find(name);
  if (it == tests().end()) render_fail("Unknown test: {}", name);
  return it->second;
}

Value list_filter_call(const Value& v, const std::string& name, const CallArgs& a, bool literal) {
  const Array& items = v.list();
  if (name == "sort") {
    const Value* rev = arg(a, 0, "reverse");
    const Value* cs = arg(a, 1, "case_sensitive");
    const Value* attr = arg(a, 2, "attribute");
    if (rev && rev->kind != Kind::Bool) render_fail("reverse must be a boolean");
    if (cs && cs->kind != Kind::Bool) render_fail("case_sensitive must be a boolean");
    if (attr && !attr->is_string() && !attr->is_int() && !attr->is_none())
      render_fail("attribute must be a string, integer, or null");
    const bool reverse = rev && rev->b, case_sensitive = cs && cs->b;
    const std::string path = !attr || attr->is_none() ? ""
                             : attr->is_int()         ? std::to_string(attr->i)
                                                      : attr->str();
    auto key = [&](const Value& x) { return path.empty() ? x : attribute_path(x, path); };
    Array out = items;
    std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
      const int c = compare(key(x), key(y), case_sensitive);
      return reverse ? c > 0 : c < 0;
    });
    return Value::array(std::move(out));
  }
  if (name == "selectattr" || name == "rejectattr") {
    for (const Value& x : items)
      if (!x.has_attributes()) render_fail("`{}` can only be applied to array of objects", name);
    if (!literal || !a.kw.empty()) render_fail("arguments of `{}` must be strings", name);
    if (a.pos.empty()) render_fail("`{}` needs the attribute to test", name);
    const std::string& attr = a.pos[0].str();
    TestFn test = a.pos.size() > 1 ? find_test(a.pos[1].str()) : nullptr;
    const Value* other = a.pos.size() > 2 ? &a.pos[2] : nullptr;
    Array out;
    for (const Value& x : items) {
      const Value* field = x.map().find(attr);
      const bool hit = field && (test ? test(*field, other) : truthy(*field));
      if (hit == (name == "selectattr")) out.push_back(x);
    }
    return Value::array(std::move(out));
  }
  if (name == "map") {
    const Value* attr = a.keyword("attribute");
    if (!attr)
      render_fail("`map` expressions without `attribute` set are not currently supported.");
    if (!attr->is_string()) render_fail("attribute must be a string");
    const Value* dflt = a.keyword("default");
    Array out;
    for (const Value& x : items) {
      if (!x.has_attributes()) render_fail("items in map must be an object");
      Value got = attribute_path(x, attr->str());
      out.push_back(got.is_undefined() && dflt ? *dflt : got);
    }
    return Value::array(std::move(out));
  }
  render_fail("Unknown ArrayValue filter: {}", name);
}

Value filter_call(const Value& v, const std::string& name, const CallArgs& a, bool literal) {
  if (name == "tojson") return str(to_json(v, json_options(a)));
  if (name == "join") {
    const Value* sep = arg(a, 0, "separator");
    if (sep && !sep->is_string()) render_fail("separator must be a string");
    const std::string d = sep ? sep->str() : "";
    if (v.is_string()) {
      std::string out;
      const auto chars = characters(v.str());
      for (size_t k = 0; k < chars.size(); ++k) out += (k ? d : "") + std::string(chars[k]);
      return str(std::move(out));
    }
    if (v.is_list()) return str(join(v.list(), d));
    cannot_apply(name, v);
  }
  if (name == "int" || name == "float") {
    const bool is_int = name == "int";
    const Value* d = arg(a, 0, "default");
    const Value dflt = d ? *d : is_int ? Value::integer(0) : Value::number(0);
    if (v.is_string()) {
      double x = 0;
      if (!(is_int ? js_parse_int(v.str(), x) : js_parse_float(v.str(), x))) return dflt;
      return is_int ? to_int(x) : Value::number(x);
    }
    if (v.is_number()) return v;
    if (v.kind == Kind::Bool) return is_int ? Value::integer(v.b) : Value::number(v.b);
    cannot_apply(name, v);
  }
  if (name == "default") {
    const Value dflt = a.pos.empty() ? str("") : a.pos[0];
    const Value* flag = arg(a, 1, "boolean");
    if (flag && flag->kind != Kind::Bool) render_fail("`default` filter flag must be a boolean");
    if (v.is_undefined() || (flag && flag->b && !truthy(v))) return dflt;
    return v;
  }
  if (v.is_list()) return list_filter_call(v, name, a, literal);
  if (v.is_string()) {
    if (name == "indent") {
      const Value* width = arg(a, 0, "width");
      if (width && !width->is_int()) render_fail("width must be a number");
      const Value* first = arg(a, 1, "first");
      const Value* blank = arg(a, 2, "blank");
      const int64_t w = width ? width->i : 4;
      return str(indent(v.str(), std::string(size_t(std::clamp<int64_t>(w, 0, 1 << 16)), ' '),
                        first && truthy(*first), blank && truthy(*blank)));
    }
    if (name == "replace") return replace(v.str(), a);
    render_fail("Unknown StringValue filter: {}", name);
  }
  if (v.is_mapping()) {
    const Value m = object_member(v, name);
    if (m.kind == Kind::Function) {
      CallArgs copy = a;
      return m.fn->call(copy);
    }
    render_fail("Unknown ObjectValue filter: {}", name);
  }
  cannot_apply(name, v);
}

Value filter_plain(const Value& v, const std::string& name) {
  if (name == "safe") return v;
  if (name == "tojson") return str(to_json(v));
  if (v.is_list()) {
    const Array& items = v.list();
    if (name == "list") return v;
    if (name == "first") return items.empty() ? Value() : items.front();
    if (name == "last") return items.empty() ? Value() : items.back();
    if (name == "length") return Value::integer(int64_t(items.size()));
    if (name == "reverse") return Value::array(Array(items.rbegin(), items.rend()));
    if (name == "sort") return list_filter_call(v, "sort", {}, false);
    if (name == "join") return str(join(items, ""));
    if (name == "string") return str(to_json(v, {}, false));
    if (name == "unique") {
      Array out;
      for (const Value& x : items)
        if (std::none_of(out.begin(), out.end(),
                         [&](const Value& y) { return strict_equal(x, y); }))
          out.push_back(x);
      return Value::array(std::move(out));
    }
    render_fail("Unknown ArrayValue filter: {}", name);
  }
  if (v.is_string()) {
    const std::string& s = v.str();
    if (name == "length") return Value::integer(int64_t(utf16_length(s)));
    if (name == "upper") return str(to_upper(s));
    if (name == "lower") return str(to_lower(s));
    if (name == "title") return str(title_case(s));
    if (name == "capitalize") return str(capitalize(s));
    if (name == "trim") return str(std::string(trim(s)));
    if (name == "indent") return str(indent(s, "    ", false, false));
    if (name == "join" || name == "string") return v;
    if (name == "int") {
      double x = 0;
      return js_parse_int(s, x) ? to_int(x) : Value::integer(0);
    }
    if (name == "float") {
      double x = 0;
      return Value::number(js_parse_float(s, x) ? x : 0.0);
    }
    render_fail("Unknown StringValue filter: {}", name);
  }
  if (v.is_number()) {
    if (name == "abs")
      return v.is_int() ? Value::integer(v.i < 0 ? -v.i : v.i) : Value::number(std::abs(v.f));
    if (name == "int") return v.is_int() ? v : to_int(std::floor(v.f));
    if (name == "float") return Value::number(v.as_double());
    if (name == "string") return str(display(v));
    render_fail("Unknown NumericValue filter: {}", name);
  }
  if (v.is_mapping()) {
    if (name == "items") return items_of(v);
    if (name == "length") return Value::integer(int64_t(v.map().items.size()));
    const Value m = object_member(v, name);
    if (m.kind == Kind::Function) {
      CallArgs none;
      return m.fn->call(none);
    }
    render_fail("Unknown ObjectValue filter: {}", name);
  }
  if (v.kind == Kind::Bool) {
    if (name == "bool") return v;
    if (name == "int") return Value::integer(v.b);
    if (name == "float") return Value::number(v.b);
    if (name == "string") return str(v.b ? "true" : "false");
    render_fail("Unknown BooleanValue filter: {}", name);
  }
  cannot_apply(name, v);
}

Value namespace_of(CallArgs& a) {
  if (a.pos.size() > 1) render_fail("namespace expected at most 1 argument, got {}", a.pos.size());
  Object o;
  if (a.pos.size() == 1) {
    const Value& src = a.pos[0];
    if (src.is_mapping()) {
      for (const auto& [k, v] : src.map().items) o.set(k, v);
    } else if (src.is_list()) {
      for (const Value& pair : src.list()) {
        if (!pair.is_list() || pair.list().size() != 2)
          render_fail("namespace expected an object or an iterable of [key, value] pairs");
        if (!pair.list()[0].is_string()) render_fail("namespace keys must be strings");
        o.set(pair.list()[0].str(), pair.list()[1]);
      }
    } else {
      render_fail("'{}' object is not iterable", type_name(src));
    }
  }
  for (auto& [k, v] : a.kw) o.set(k, v);
  return Value::name_space(std::move(o));
}

Value range_of(CallArgs& a) {
  if (a.pos.empty() || a.pos.size() > 3) render_fail("range() takes 1 to 3 arguments");
  for (const Value& x : a.pos)
    if (!x.is_number()) render_fail("range() arguments must be numbers, got {}", type_name(x));
  double start = 0, stop = a.pos[0].as_double(), step = 1;
  if (a.pos.size() > 1) start = a.pos[0].as_double(), stop = a.pos[1].as_double();
  if (a.pos.size() > 2) step = a.pos[2].as_double();
  if (step == 0) render_fail("range() step must not be zero");
  if ((stop - start) / step > kMaxRange)
    render_fail("range() of more than {} items", int64_t(kMaxRange));
  Array out;
  for (double i = start; step > 0 ? i < stop : i > stop; i += step)
    out.push_back(std::floor(i) == i ? Value::integer(int64_t(i)) : Value::number(i));
  return Value::array(std::move(out));
}

// The reference's strftime: %Y %m %d %b %B %H %M %% in local time, English
// month names; any other directive stays as written.
Value strftime_now(CallArgs& a) {
  if (a.pos.empty() || !a.pos[0].is_string()) render_fail("strftime_now() needs a format string");
  static const char* kMonths[] = {"January",   "February", "March",    "April",
                                  "May",       "June",     "July",     "August",
                                  "September", "October",  "November", "December"};
  const std::time_t now = std::time(nullptr);
  std::tm t{};
  localtime_r(&now, &t);
  const std::string& f = a.pos[0].str();
  std::string out;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%' || i + 1 >= f.size() ||
        std::string_view("YmdbBHM%").find(f[i + 1]) == std::string_view::npos) {
      out += f[i];
      continue;
    }
    switch (f[++i]) {
      case 'Y':
        out += std::to_string(t.tm_year + 1900);
        break;
      case 'm':
        out += fmt::format("{:02}", t.tm_mon + 1);
        break;
      case 'd':
        out += fmt::format("{:02}", t.tm_mday);
        break;
      case 'b':
        out += std::string(kMonths[t.tm_mon]).substr(0, 3);
        break;
      case 'B':
        out += kMonths[t.tm_mon];
        break;
      case 'H':
        out += fmt::format("{:02}", t.tm_hour);
        break;
      case 'M':
        out += fmt::format("{:02}", t.tm_min);
        break;
      default:
        out += '%';
    }
  }
  return str(std::move(out));
}

}  // namespace

Value builtin_member(const Value& v, const std::string& name) {
  if (v.is_string()) return string_member(v, name);
  if (v.is_mapping()) return object_member(v, name);
  if (v.is_list() && name == "length") return Value::integer(int64_t(v.list().size()));
  if (v.is_list() && name == "index") {  // Python's list.index (not in the reference)
    const Value self = v;
    return Value::function(name, [self](CallArgs& a) {
      const Value* x = arg(a, 0);
      if (!x) render_fail("index() takes exactly one argument");
      for (size_t i = 0; i < self.list().size(); ++i)
        if (strict_equal(self.list()[i], *x)) return Value::integer(int64_t(i));
      render_fail("{} is not in list", display(*x));
    });
  }
  return Value();
}

Value apply_filter(const Value& v, const std::string& name, const CallArgs* args, bool literal) {
  return args ? filter_call(v, name, *args, literal) : filter_plain(v, name);
}

bool apply_test(const std::string& name, const Value& v) {
  return find_test(name)(v, nullptr);
}

std::vector<std::pair<std::string, Value>> builtin_globals() {
  return {
      {"false", Value::boolean(false)},
      {"true", Value::boolean(true)},
      {"none", Value::none()},
      {"False", Value::boolean(false)},
      {"True", Value::boolean(true)},
      {"None", Value::none()},
      {"raise_exception", Value::function("raise_exception",
                                          [](CallArgs& a) -> Value {
                                            RenderError e;
                                            e.message =
                                                a.pos.empty() ? "undefined" : raw_string(a.pos[0]);
                                            e.raised = true;
                                            throw e;
                                          })},
      {"range", Value::function("range", range_of)},
      {"strftime_now", Value::function("strftime_now", strftime_now)},
      {"namespace", Value::function("namespace", namespace_of)},
  };
}

}  // namespace nk::jinja
