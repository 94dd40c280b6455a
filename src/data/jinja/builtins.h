// What a template can call without defining it, as the reference
// (@huggingface/jinja) provides it:
//   methods   strings: upper lower strip lstrip rstrip title capitalize split
//             replace startswith endswith, .length; mappings: get items keys
//             values dictsort; lists: .length, and index(x) (Python's, which
//             lm-evaluation-harness's task templates call; not the reference's)
//   filters   safe tojson(indent, ensure_ascii, sort_keys, separators) length
//             first last list reverse sort unique join default trim upper
//             lower title capitalize indent replace int float abs string bool
//             items selectattr rejectattr map(attribute=)
//   tests     defined undefined none string number integer boolean mapping
//             iterable sequence callable true false odd even lower upper
//             equalto eq
//   globals   raise_exception range namespace strftime_now, true false none
//             (and True False None)
// The reference's own limits are kept (strip() takes no argument and strips
// all white space; a mapping is not iterable; strings compare only with ==),
// since templates are rendered to match it byte for byte.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "data/jinja/value.h"

namespace nk::jinja {

// The built-in member `name` of `v` (a bound method or a property), or
// undefined.
Value builtin_member(const Value& v, const std::string& name);

// `v | name` (args null) or `v | name(args)`. literal_args: every argument
// was written as a string literal (what selectattr/rejectattr require).
// RenderError for a filter that does not apply to v's type.
Value apply_filter(const Value& v, const std::string& name, const CallArgs* args,
                   bool literal_args);

// `v is name`; RenderError for an unknown test.
bool apply_test(const std::string& name, const Value& v);

// The global names and their values, in the order they are declared.
std::vector<std::pair<std::string, Value>> builtin_globals();

}  // namespace nk::jinja
