// SteerLM's label strings and conditioned prompts: written in the spec's
// order whatever order they were given in, parsed back with every bad name
// or value an error naming where, a model's score rounded and clipped, and
// the conditioned prompt of data preparation equal to generation's.
#include <gtest/gtest.h>

#include "align/steerlm.h"
#include "test_util.h"

namespace nk {
namespace {

using json = nlohmann::json;
using test::contains;
using test::error_of;

SteerLmSpec helpsteer() {
  SteerLmSpec s;
  s.names = helpsteer_attributes();
  return s;
}

TEST(SteerLm, LabelStringsRoundTripInSpecOrder) {
  const SteerLmSpec s = helpsteer();
  EXPECT_EQ(attribute_string(s, {4, 3, 4, 1, 0}),
            "helpfulness:4,correctness:3,coherence:4,complexity:1,verbosity:0");
  const auto v = parse_attribute_string(
      s, " verbosity:0, helpfulness:4,correctness:3 ,coherence:4,complexity:1", "k");
  ASSERT_EQ(v.size(), 5u);
  EXPECT_EQ(*v[0], 4);
  EXPECT_EQ(*v[4], 0);
  const auto partial = parse_attribute_string(s, "verbosity:2", "k", true);
  EXPECT_FALSE(partial[0].has_value());
  EXPECT_EQ(*partial[4], 2);
  EXPECT_EQ(split_attribute_names(" a, b,,c "), (std::vector<std::string>{"a", "b", "c"}));
}

TEST(SteerLm, BadNamesAndValuesNameWhere) {
  const SteerLmSpec s = helpsteer();
  auto err = [&](const std::string& x) {
    return error_of([&] { parse_attribute_string(s, x, "f.jsonl:3: label"); });
  };
  const std::string all = "helpfulness:4,correctness:3,coherence:4,complexity:1,";
  EXPECT_TRUE(contains(err(all + "humor:2"), "f.jsonl:3: label: unknown attribute 'humor'"));
  EXPECT_TRUE(contains(err(all + "verbosity:5"), "verbosity: 5 is outside [0, 4]"));
  EXPECT_TRUE(contains(err(all + "verbosity:-1"), "verbosity: -1 is outside [0, 4]"));
  EXPECT_TRUE(contains(err(all + "verbosity:2.5"), "verbosity: '2.5' is not an integer"));
  EXPECT_TRUE(contains(err(all + "verbosity"), "'verbosity' is not NAME:VALUE"));
  EXPECT_TRUE(contains(err(all + "verbosity:1,verbosity:2"), "'verbosity' given twice"));
  EXPECT_TRUE(contains(err("helpfulness:4"), "attribute 'correctness' has no value"));
  SteerLmSpec bad = s;
  bad.names.push_back("helpfulness");
  EXPECT_TRUE(contains(error_of([&] { bad.check("align.steerlm_attributes"); }),
                       "align.steerlm_attributes: attribute 'helpfulness' named twice"));
  bad = s;
  bad.names = {"a:b"};
  EXPECT_TRUE(contains(error_of([&] { bad.check("k"); }), "'a:b' holds ':'"));
  bad = s;
  bad.prompt_template = "no placeholder";
  EXPECT_TRUE(contains(error_of([&] { bad.check("k"); }), "has no {attributes}"));
  bad = s;
  bad.min_value = 5;
  EXPECT_TRUE(contains(error_of([&] { bad.check("k"); }), "range [5, 4] is empty"));
}

TEST(SteerLm, ModelScoresAreRoundedAndClipped) {
  const SteerLmSpec s = helpsteer();
  EXPECT_EQ(attribute_value(s, 2.4), 2);
  EXPECT_EQ(attribute_value(s, 2.6), 3);
  EXPECT_EQ(attribute_value(s, -0.7), 0);
  EXPECT_EQ(attribute_value(s, 9.0), 4);
  EXPECT_TRUE(contains(error_of([&] { attribute_value(s, NAN); }), "a score of nan"));
}

TEST(SteerLm, PromptsGetTheLabelAsSystemMessageOrPrefix) {
  SteerLmSpec s = helpsteer();
  s.prompt_template = "<extra_id_2>{attributes}";
  const std::string label = "helpfulness:4,correctness:3,coherence:4,complexity:1,verbosity:0";
  EXPECT_EQ(steerlm_prompt(s, label, "say a", "p"), "<extra_id_2>" + label + "\nsay a");
  const json chat = json::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(steerlm_prompt(s, label, chat, "p"),
            json::parse(R"([{"role": "system", "content": "<extra_id_2>)" + label +
                        R"("}, {"role": "user", "content": "hi"}])"));
  const json with_system = json::parse(
      R"([{"role": "system", "content": "be kind"}, {"role": "user", "content": "hi"}])");
  EXPECT_EQ(steerlm_prompt(s, label, with_system, "p")[0]["content"],
            "<extra_id_2>" + label + "\nbe kind");
  EXPECT_TRUE(contains(error_of([&] { steerlm_prompt(s, label, json(1), "f:1: prompt"); }),
                       "f:1: prompt: must be a string or a non-empty list"));
}

TEST(SteerLm, GenerationConditionsAsDataPreparationDoes) {
  const SteerLmSpec s = helpsteer();
  // Data preparation: the record's values in spec order.
  const json prep = steerlm_prompt(s, attribute_string(s, {1, 2, 3, 4, 0}), "Q?", "p");
  // Generation: the user's values in any order.
  const json gen = steerlm_condition(
      s, "verbosity:0,complexity:4,coherence:3,correctness:2,helpfulness:1", "Q?", "k");
  EXPECT_EQ(prep, gen);
  const SteerLmSpec back = SteerLmSpec::from_json(s.to_json(), "steerlm.json");
  EXPECT_EQ(back.names, s.names);
  EXPECT_EQ(back.prompt_template, s.prompt_template);
  EXPECT_TRUE(contains(error_of([&] {
                         SteerLmSpec::from_json(json{{"attributes", 1}}, "m/steerlm.json");
                       }),
                       "m/steerlm.json: not a SteerLM spec"));
  // Without a model's steerlm.json: the names as given, in their order.
  test::TempDir dir("nk_steerlm");
  const SteerLmSpec loose = steerlm_spec_for(dir.path(), "b:1,a:7", "", "k");
  EXPECT_EQ(loose.names, (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(steerlm_condition(loose, "a:7,b:1", "Q", "k"), "b:1,a:7\nQ");
}

}  // namespace
}  // namespace nk
