// The Jinja interpreter piece by piece against Hugging Face's own
// (@huggingface/jinja, tests/data/chat/render.js): small templates on
// whitespace control, loops, scoping, set, namespaces, macros and call
// blocks, filters, tests, methods, operators and printing, each rendered
// byte for byte as the reference renders it; templates the reference
// refuses, refused too. Then what the reference has no answer for: errors
// that name the template, line and column, and renders that would never end
// or grow without bound stopped with a clear error.
#include "data/jinja/template.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/chat/jinja_reference.h"
#include "test_util.h"

namespace nk::jinja {
namespace {

using ojson = nlohmann::ordered_json;
using test::contains;

const ojson& context() {
  static const ojson c = ojson::parse(R"({
    "xs": [1, 2, 3, 4],
    "s": "  Hello wörld  ",
    "u": null,
    "n": null,
    "x": 1,
    "flag": true,
    "name": "Ann",
    "text": "one\n\n  two\nthree",
    "d": {"b": 2, "a": 1, "c": [1, "two"]},
    "obj": {"b": 1, "a": [1, 2.5, true, null, "x"], "c": {"d": "e\u00e9"}},
    "msgs": [{"role": "system", "content": "S"}, {"role": "user", "content": "U1", "extra": 1},
             {"role": "assistant", "content": "A"}, {"role": "user", "content": "U2"}]
  })");
  return c;
}

// Templates every feature chat templates use; each must render as the
// reference renders it (or fail where it fails).
const std::vector<std::string>& snippets() {
  static const std::vector<std::string> s = {
      // whitespace control, trim_blocks, lstrip_blocks, the trailing newline
      "  {%- if true -%}  x  {%- endif -%}  y",
      "line1\n  {% if true %}\n  yes\n  {% endif %}\nend\n",
      "a  {{- 'b' -}}  c {{ 'd' }}  \n  e",
      "{% for x in xs %}\n    {{ x }}\n{% endfor %}\n",
      "  {# comment #}\nA{#- trimmed -#}  B {# keep #} C",
      "A {% generation %} B {% endgeneration %} C {%- generation -%} D",
      "x\n\n",
      // loops
      "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/"
      "{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}:{{ x }}"
      "{% if not loop.last %},{% endif %}{% endfor %}",
      "{% for x in xs if x > 1 %}{{ x }}{{ loop.index }}{% else %}none{% endfor %}|"
      "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}",
      "{% for x in xs %}{{ loop.previtem }}-{{ x }}-{{ loop.nextitem }};{% endfor %}",
      "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
      "{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}"
      "{% endif %}{{ x }}{% endfor %}",
      "{% for x in xs %}a{% break %}{% endfor %}|{% for x in xs %}{{ x }}{% continue %}"
      "{% else %}else{% endfor %}",
      "{% for m in msgs[::-1] %}{{ m.role[0] }}{% endfor %}",
      "{% for i in range(3) %}{{ i }}{% endfor %} {{ range(1, 10, 3) | list }} "
      "{{ range(5, 0, -2) | list }}",
      // set, scoping, namespaces
      "{% set a = 1 %}{% for x in xs %}{% set a = x %}{% endfor %}{{ a }}"
      "{% if true %}{% set a = 5 %}{% endif %}{{ a }}",
      "{% for m in xs %}{% set last = m %}{% endfor %}[{{ last }}]",
      "{% set ns = namespace(found=false, n=0) %}{% for x in xs %}{% if x > 1 %}"
      "{% set ns.found = true %}{% set ns.n = ns.n + x %}{% endif %}{% endfor %}"
      "{{ ns.found }} {{ ns.n }} {{ ns }}",
      "{% set ns = namespace(d) %}{{ ns.a }}{% set ns.a = 9 %}{{ ns.a }}{{ d.a }}",
      "{% set block %}hello {{ name }}  {% endset %}[{{ block | trim }}]",
      "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = (3, 4) %}{{ c[1] }}",
      "{% set messages = msgs[1:] %}{{ messages | length }}{{ messages[0].content }}",
      // macros and call blocks
      "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}"
      "{{ greet('Ann') }} {{ greet('Bob', greeting='Hi') }} {{ greet(name='Cy', greeting='Yo') }}",
      "{% macro m(a) %}{{ a }}|{{ varargs }}|{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}",
      "{% macro m(a, b=a ~ '!') %}{{ a }}{{ b }}{% endmacro %}{{ m('x') }}{{ m(*['y', 'z']) }}"
      "{{ m(**{'a': 'k'}) }}",
      "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}"
      "{% call wrap('b') %}bold {{ name }}{% endcall %}",
      "{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}"
      "{% call(item) each([1, 2]) %}[{{ item }}]{% endcall %}",
      "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}",
      "{% filter upper %}shout {{ name }}{% endfilter %}{% filter replace('a', 'b') %}aaa"
      "{% endfilter %}",
      // operators and printing
      "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} "
      "{{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ -3 + 1 }} {{ 1.5 + 1 }} {{ 2.0 }} {{ 10 / 5 }} "
      "{{ 0.1 + 0.2 }} {{ 1 - 1.0 }} {{ 3 * 1.5 }} {{ 123456789 * 1000000000 }}",
      "{{ 1 < 2 and 2 <= 2 }} {{ not true or false }} {{ 'a' in 'cat' }} {{ 'x' not in ['a'] }} "
      "{{ 1 == 1.0 }} {{ none == undef }} {{ 'b' in d }} {{ 2 in xs }} {{ '1' == 1 }} "
      "{{ true == 1 }} {{ msgs[0] == msgs[0] }} {{ [1] == [1] }} {{ 'a' != 'b' }} {{ 0 or 'z' }} "
      "{{ 'y' and 0 }} {{ [] or 'empty' }}",
      "{{ 'yes' if flag else 'no' }} [{{ 'shown' if flag }}] [{{ 'hidden' if not flag }}] "
      "{{ 'a' if false else 'b' if false else 'c' }}",
      "{{ 'a' ~ 1 ~ true ~ 2.0 ~ 2.5 }} {{ 'x' + 1 }} {{ 1 + 'x' }} {{ xs + [5] }} {{ 'n' ~ xs }}",
      "{{ xs }} {{ d }} {{ obj }} {{ true }}[{{ none }}][{{ undef }}]{{ 1.0 }} {{ -0.0 }} {{ u }}",
      // strings
      "{{ s.upper() }} {{ s.lower() }} {{ 'hello wORLD_x y-z'.title() }} {{ 'élan "
      "vital'.capitalize() }} "
      "[{{ s.strip() }}] [{{ s.lstrip() }}] [{{ s.rstrip() }}] {{ s.split() }} "
      "{{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ ' a  b c '.split(none, 1) }} "
      "{{ s.startswith('  He') }} {{ s.endswith(('x', 'd  ')) }} {{ s.replace('l', 'L') }} "
      "{{ 'aaa'.replace('a', 'b', 2) }} {{ 'ab'.replace('', '-') }} {{ s.length }} "
      "{{ 'x\\n'.strip('\\n') }}",
      "{{ xs[::-1] }} {{ xs[1:] }} {{ xs[:2] }} {{ xs[-1] }} {{ xs[1:3] }} {{ 'héllo'[1:3] }} "
      "{{ 'abc'[::-1] }} {{ xs[::2] }} {{ xs[10] }}|{{ 'abc'[1] }} {{ xs[-2:] }} {{ xs[5:1:-1] }}",
      "{{ 'a' 'b' }} {{ \"q\\\"t\" }} {{ '\\u00e9\\t|' }} {{ 'it\\'s' }}",
      // tests
      "{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ n is none }} {{ u is none }} "
      "{{ s is string }} {{ d is mapping }} {{ xs is iterable }} {{ d is iterable }} "
      "{{ s is iterable }} {{ 3 is odd }} {{ 4 is even }} {{ 1 is number }} {{ 1 is integer }} "
      "{{ 1.5 is integer }} {{ true is boolean }} {{ x is not none }} {{ 'ab' is lower }} "
      "{{ 'AB' is upper }} {{ d is sequence }} {{ greet is callable }} {{ false is false }}",
      // filters
      "{{ xs | length }} {{ s | length }} {{ d | length }} {{ xs | first }} {{ xs | last }} "
      "{{ xs | join(', ') }} {{ xs | join }} {{ xs | reverse | list }} {{ [3, 1, 2] | sort }} "
      "{{ ['b', 'A', 'c'] | sort }} {{ s | trim }} {{ s | upper }} {{ u | default('dflt') }} "
      "{{ undef | default('dflt') }} {{ '' | default('e', true) }} {{ d | items }} {{ '42' | int "
      "}} "
      "{{ 'x' | int }} {{ '4.5' | float }} {{ 3.7 | int }} {{ 5 | string }} {{ xs | string }} "
      "{{ [1, 1, 2] | unique }} {{ -3 | abs }} {{ 'ab' | list if false }} {{ 'abc' | join('-') }} "
      "{{ msgs | sort(attribute='role') | map(attribute='content') | join }} "
      "{{ 'X' | safe }} {{ true | string }} {{ d | dictsort }}",
      "{{ msgs | selectattr('role', 'equalto', 'user') | list | length }} "
      "{{ msgs | rejectattr('role', 'equalto', 'user') | map(attribute='content') | join('|') }} "
      "{{ msgs | map(attribute='content') | list }} {{ msgs | selectattr('extra') | list | length "
      "}} "
      "{{ msgs | map(attribute='nope', default='-') | join }}",
      "{{ obj | tojson }} | {{ obj | tojson(indent=2) }} | {{ obj | tojson(sort_keys=true) }} | "
      "{{ 'é\"<>&\\n\\u0001' | tojson }} | {{ 'é😀' | tojson(ensure_ascii=true) }} | "
      "{{ [] | tojson(indent=4) }} | {{ {} | tojson(indent=4) }} | {{ 1.0 | tojson }} | "
      "{{ obj | tojson(separators=(',', ':')) }} | {{ ns_undefined | tojson }} | {{ 0.1 | tojson "
      "}}",
      "{{ text | indent }}|{{ text | indent(2, true) }}|{{ text | indent(first=true, blank=true) "
      "}}",
      "{{ d.get('a') }} {{ d.get('zz', 'dflt') }} {{ d.get('zz') }} {{ d.keys() | list }} "
      "{{ d.values() | list }} {{ d.items() | list }} {{ d['a'] }} {{ d.a }} {{ d.c[1] }} "
      "{{ msgs[0]['role'] }} {{ msgs[-1].content }}",
      // the template's own refusal
      "{% if x > 0 %}{{ raise_exception('x is ' ~ x) }}{% endif %}",
  };
  return s;
}

// Templates both must refuse (syntax and run-time errors).
const std::vector<std::string>& refused() {
  static const std::vector<std::string> s = {
      "{% if %}x{% endif %}",
      "{{ x + }}",
      "{% for x in %}{% endfor %}",
      "{% if true %}never closed",
      "{% endfor %}",
      "{% unknown %}",
      "{{ 'unterminated }}",
      "{{ undef.x.y }}{{ undef[0] }}",
      "{{ 'a' < 'b' }}",
      "{{ none + 1 }}",
      "{{ undef | trim }}",
      "{{ xs | nosuchfilter }}",
      "{{ x is nosuchtest }}",
      "{{ (1, 2) }}",
      "{% set x.y = 1 %}",
      "{{ x() }}",
      "{% for a, b in xs %}{% endfor %}",
      "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}",
  };
  return s;
}

std::string ours(const std::string& src, const ojson& ctx) {
  return Template(src, "snippet").render(ctx);
}

TEST(JinjaTemplate, RendersLikeHuggingFacesJinja) {
  REQUIRE_JINJA_REFERENCE();
  ojson cases = ojson::array();
  for (const std::string& s : snippets())
    cases.push_back({{"template", s}, {"context", context()}});
  for (const std::string& s : refused()) cases.push_back({{"template", s}, {"context", context()}});
  const nlohmann::json ref = test::jinja_reference(cases);
  ASSERT_EQ(ref.size(), cases.size());
  int compared = 0;
  for (size_t i = 0; i < snippets().size(); ++i) {
    const std::string& src = snippets()[i];
    SCOPED_TRACE("template: " + src);
    if (ref[i].contains("error")) {
      EXPECT_THROW(ours(src, context()), Error) << "the reference refuses: " << ref[i]["error"];
      continue;
    }
    std::string got;
    ASSERT_NO_THROW(got = ours(src, context()));
    EXPECT_EQ(got, ref[i]["text"].get<std::string>());
    ++compared;
  }
  // Only the last snippet (raise_exception) is refused.
  EXPECT_EQ(compared, int(snippets().size()) - 1);
  int refusals = 0;
  for (size_t k = 0; k < refused().size(); ++k) {
    const std::string& src = refused()[k];
    const nlohmann::json& r = ref[snippets().size() + k];
    SCOPED_TRACE("template: " + src);
    EXPECT_TRUE(r.contains("error")) << "the reference renders: " << r.dump();
    EXPECT_THROW(ours(src, context()), Error);
    refusals += r.contains("error");
  }
  EXPECT_EQ(refusals, int(refused().size()));
}

std::string error_of(const std::string& src, const ojson& ctx = ojson::object()) {
  try {
    ours(src, ctx);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(JinjaTemplate, SyntaxErrorsNameTheTemplateLineAndColumn) {
  EXPECT_TRUE(contains(error_of("line one\n{% if x %}\n  {{ x + }}\n{% endif %}"), "snippet:3:"))
      << error_of("line one\n{% if x %}\n  {{ x + }}\n{% endif %}");
  const std::string e = error_of("a\nb {% for x in xs %}\n{{ x }}");
  EXPECT_TRUE(contains(e, "snippet:")) << e;
  EXPECT_TRUE(contains(e, "syntax error")) << e;
  EXPECT_TRUE(contains(e, "endfor")) << e;
  const std::string u = error_of("ok\n\n   {% frobnicate %}");
  EXPECT_TRUE(contains(u, "snippet:3:7: syntax error: unknown statement 'frobnicate'")) << u;
  const std::string s = error_of("{{ 'never closed }}");
  EXPECT_TRUE(contains(s, "snippet:1:4:")) << s;
  EXPECT_TRUE(contains(s, "string literal")) << s;
}

TEST(JinjaTemplate, RuntimeErrorsNameTheLine) {
  const std::string e = error_of("first\nsecond {{ none + 1 }}", ojson::object());
  EXPECT_TRUE(contains(e, "snippet:2:")) << e;
  EXPECT_TRUE(contains(e, "null")) << e;
  const std::string r = error_of(
      "{% if messages[0].role != 'user' %}\n  {{- raise_exception('Roles must alternate') }}\n{% "
      "endif %}",
      {{"messages", {{{"role", "assistant"}, {"content", "x"}}}}});
  EXPECT_TRUE(contains(r, "snippet:2:")) << r;
  EXPECT_TRUE(contains(r, "raise_exception: Roles must alternate")) << r;
}

// Renders that would not end are stopped by a bound, with a message saying
// which; so is nesting that would overflow the stack.
TEST(JinjaTemplate, RunawayTemplatesAreStopped) {
  const std::string rec = error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}");
  EXPECT_TRUE(contains(rec, "deeper than")) << rec;
  const std::string rec2 = error_of("{% macro f(n) %}{{ f(n + 1) }}x{% endmacro %}{{ f(0) }}");
  EXPECT_TRUE(contains(rec2, "deeper than")) << rec2;
  const std::string loop = error_of(
      "{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}");
  EXPECT_TRUE(contains(loop, "steps")) << loop;
  const std::string grow = error_of(
      "{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}{{ ns.s | length }}");
  EXPECT_TRUE(contains(grow, "MiB")) << grow;
  const std::string big = error_of("{{ range(100000000) | length }}");
  EXPECT_TRUE(contains(big, "range()")) << big;
  std::string deep(5000, '(');
  deep = "{{ " + deep + "1" + std::string(5000, ')') + " }}";
  const std::string nest = error_of(deep);
  EXPECT_TRUE(contains(nest, "deeper than")) << nest;
  std::string ifs;
  for (int i = 0; i < 3000; ++i) ifs += "{% if true %}";
  const std::string nest2 = error_of(ifs);
  EXPECT_TRUE(contains(nest2, "deeper than")) << nest2;
}

TEST(JinjaTemplate, RendersConcurrentlyAndRepeatedly) {
  const Template t("{% for m in messages %}{{ m.content }}{% endfor %}", "t");
  ojson ctx = {{"messages", ojson::array()}};
  for (int i = 0; i < 50; ++i) ctx["messages"].push_back({{"content", std::to_string(i)}});
  const std::string want = t.render(ctx);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i)
        if (t.render(ctx) != want) ++bad;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

// lm-evaluation-harness renders task templates with Python Jinja's
// defaults (no trim_blocks or lstrip_blocks, the trailing newline kept) and
// StrictUndefined, and ARC's calls list.index: chat = false and
// strict_undefined give exactly that, and the chat settings stay as they were.
TEST(JinjaTemplate, PythonJinjaSettingsForTaskTemplates) {
  const ojson ctx = {{"x", 1}, {"labels", {"A", "B", "C"}}, {"key", "B"}};
  const std::string src = "a {% if x %}b{% endif %}\n  {% if x %}c{% endif %}\n";
  EXPECT_EQ(Template(src, "t", false).render(ctx), "a b\n  c\n");
  EXPECT_EQ(Template(src, "t").render(ctx), "a bc");
  EXPECT_EQ(Template("{{ labels.index(key) }}", "t", false).render(ctx), "1");
  EXPECT_TRUE(contains(error_of("{{ labels.index('Z') }}", ctx), "is not in list"));
  EXPECT_EQ(Template("[{{ missing }}]", "t", false).render(ctx), "[]");
  try {
    Template("line\n{{ missing }}", "t", false).render(ctx, true);
    ADD_FAILURE() << "an undefined value printed under strict_undefined";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "t:2:") && contains(e.what(), "'missing' is undefined"))
        << e.what();
  }
}

}  // namespace
}  // namespace nk::jinja
