// The harness's text handling against Python's own: re.findall's shapes and
// re.sub through PCRE2, the regex filter (group_select, multi-group matches,
// fallback, strip), exact_match's options in their order, the word count
// re.split(r"\s+") gives (Unicode white space), len() in code points,
// strip() and rstrip() (which the context of a log-likelihood pair uses), and
// the list literals a choice template renders, as ast.literal_eval reads
// them.
#include "eval/metrics.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "eval/py_text.h"
#include "eval/task_prompt.h"
#include "test_util.h"

namespace nk {
namespace {

using Json = nlohmann::ordered_json;

Json python(const std::string& code) {
  test::TempDir d("nk_evalmetrics");
  test::write_file(d / "r.py", code);
  auto r = test::run_command("/usr/bin/python3 " + (d / "r.py"), false);
  EXPECT_EQ(r.code, 0) << r.out;
  return Json::parse(r.out);
}

const std::vector<std::pair<std::string, std::string>> kCases = {
    {R"(#### (\-?[0-9\.\,]+))", "so #### 1,234.5 and #### -7"},
    {R"((-?[$0-9.,]{2,})|(-?[0-9]+))", "costs $12, or 7 then 3.5"},
    {R"([a-z]+)", "Hello wörld, ok"},
    {R"(x*)", "axxb"},
    {R"((a)(b)?)", "ab a"},
};

TEST(EvalMetrics, RegexesAsPythonsRe) {
  Json in = Json::array();
  for (const auto& [p, t] : kCases) in.push_back({p, t});
  const Json want = python("import json, re\ncases = json.loads(" + Json(in.dump()).dump() +
                           ")\nprint(json.dumps([[re.findall(p, t), re.sub(p, '', t)] for p, t in "
                           "cases]))\n");
  for (size_t i = 0; i < kCases.size(); ++i) {
    const auto& [p, t] = kCases[i];
    const auto got = regex_findall(p, t);
    const Json& w = want[i][0];
    ASSERT_EQ(got.size(), w.size()) << p;
    for (size_t k = 0; k < got.size(); ++k) {
      if (w[k].is_string())
        EXPECT_EQ(got[k], std::vector<std::string>{w[k].get<std::string>()}) << p;
      else
        EXPECT_EQ(got[k], w[k].get<std::vector<std::string>>()) << p;
    }
    EXPECT_EQ(regex_remove(p, t), want[i][1].get<std::string>()) << p;
  }
}

TEST(EvalMetrics, FiltersAndExactMatch) {
  FilterSpec strict{"strict", {FilterStep{"regex"}, FilterStep{"take_first"}}};
  EXPECT_EQ(apply_filter(strict, {"x #### 42 y #### 7", "other"}), std::vector<std::string>{"42"});
  EXPECT_EQ(apply_filter(strict, {"no answer"}), std::vector<std::string>{"[invalid]"});
  FilterStep flex{"regex", R"((-?[$0-9.,]{2,})|(-?[0-9]+))", -1, "none"};
  EXPECT_EQ(apply_filter({"f", {flex}}, {"is $1,200 or 5"}), std::vector<std::string>{"5"});
  flex.group_select = 0;
  EXPECT_EQ(apply_filter({"f", {flex}}, {"is $1,200 or 5"}), std::vector<std::string>{"$1,200"});
  EXPECT_EQ(apply_filter({"f", {FilterStep{"remove_whitespace"}, FilterStep{"lowercase"}}},
                         {" \tÀb C\u00a0"}),
            std::vector<std::string>{"àb c"});
  // Self-consistency (repeats): the first k answers, then the most frequent
  // one, ties to the first seen (Python's Counter.most_common(1)).
  FilterStep first3{"take_first_k"};
  first3.k = 3;
  const FilterSpec maj3{"maj@3", {first3, FilterStep{"majority_vote"}, FilterStep{"take_first"}}};
  EXPECT_EQ(apply_filter(maj3, {"b", "a", "a", "b", "b"}), std::vector<std::string>{"a"});
  EXPECT_EQ(apply_filter(maj3, {"c", "b", "a", "a", "a"}), std::vector<std::string>{"c"});
  const FilterSpec maj{"maj", {FilterStep{"majority_vote"}}};
  EXPECT_EQ(apply_filter(maj, {"b", "a", "a", "b", "b"}), std::vector<std::string>{"b"});
  EXPECT_EQ(apply_filter(maj, {"x", "y", "y", "x"}), std::vector<std::string>{"x"});
  EXPECT_EQ(apply_filter({"k", {first3}}, {"1", "2", "3", "4"}),
            (std::vector<std::string>{"1", "2", "3"}));
  // The vote after a regex: answers that extract the same number agree.
  const FilterSpec vote{"v", {FilterStep{"regex"}, FilterStep{"majority_vote"}}};
  EXPECT_EQ(apply_filter(vote, {"#### 7", "so #### 9", "#### 9 ok", "none"}),
            std::vector<std::string>{"9"});
  EXPECT_THROW(apply_filter({"k", {first3}}, {"1", "2"}), Error);
  MetricSpec m;
  EXPECT_EQ(exact_match("Paris", "paris", m), 0.0);
  m.ignore_case = true;
  EXPECT_EQ(exact_match("Paris", "paris", m), 1.0);
  m.ignore_punctuation = true;
  EXPECT_EQ(exact_match("Paris!", "paris.", m), 1.0);
  m.regexes_to_ignore = {",", R"(\$)", "(?s).*#### ", R"(\.$)"};
  EXPECT_EQ(exact_match("$1,200", "so\n#### 1200", m), 1.0);
  m.ignore_numbers = true;
  EXPECT_EQ(exact_match("a1", "a22", m), 1.0);
  EXPECT_THROW(regex_findall("(unclosed", "x"), Error);
}

TEST(EvalMetrics, CountsAndLiteralsAsPython) {
  const std::vector<std::string> texts = {"a b  c",           " lead and trail ",    "",
                                          "tab\tnew\nline",   "nbsp\u00a0em\u2003x", "é中 ö",
                                          "end\u00a0\u3000\n"};
  const Json want = python(
      "import json, re\nts = json.loads(" + Json(Json(texts).dump()).dump() +
      ")\nprint(json.dumps([[len(re.split(r'\\s+', t)), len(t), t.strip(), t.rstrip()] for t in "
      "ts]))\n");
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(count_words(texts[i]), want[i][0].get<int64_t>()) << texts[i];
    EXPECT_EQ(code_points(texts[i]), want[i][1].get<int64_t>()) << texts[i];
    EXPECT_EQ(py_strip(texts[i]), want[i][2].get<std::string>()) << texts[i];
    EXPECT_EQ(py_rstrip(texts[i]), want[i][3].get<std::string>()) << texts[i];
  }
  EXPECT_EQ(parse_list_literal(R"(['it\'s', "b", 3, [True, None]])", "t"),
            Json::parse(R"(["it's", "b", 3, [true, null]])"));
  EXPECT_EQ(parse_list_literal(R"(["\u00e9", "x"])", "t"), Json::parse(R"(["é", "x"])"));
  EXPECT_THROW(parse_list_literal("['a', b]", "t"), Error);
  EXPECT_THROW(parse_list_literal("'a'", "t"), Error);
}

TEST(EvalMetrics, MeanStderrAndAggregations) {
  EXPECT_FALSE(mean_stderr({1.0}).has_value());
  // sqrt(Σ(x - 0.5)² / 3) / 2 for 0, 1, 0, 1
  EXPECT_DOUBLE_EQ(*mean_stderr({0, 1, 0, 1}), std::sqrt(1.0 / 3.0) / 2.0);
  EXPECT_DOUBLE_EQ(perplexity({-1.0, -3.0}), std::exp(2.0));
  EXPECT_DOUBLE_EQ(weighted_perplexity({{-2.0, 1.0}, {-4.0, 2.0}}), std::exp(2.0));
  EXPECT_DOUBLE_EQ(bits_per_byte({{-2.0, 1.0}, {-4.0, 2.0}}), 2.0 / std::log(2.0));
}

}  // namespace
}  // namespace nk
