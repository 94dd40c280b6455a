// Stage options are declared as the training config's keys are (a ConfigSchema,
// one bind per key): values parse alike and an unknown key names the nearest.
#include "curate/stage_config.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "curate/stage_util.h"
#include "test_util.h"

namespace nk::curate {
namespace {

using nk::test::contains;
using nk::test::error_of;

// The fields of an imaginary stage, bound the way every stage binds its own.
struct Fields {
  int64_t min_words = 50;
  uint32_t partitions = 64;
  double ratio = 0.25;
  bool enabled = true;
  std::string label = "hq";
  std::vector<std::string> langs = {"en"};
  std::vector<std::pair<std::string, double>> limits = {{"2", 0.2}};
  bool given_min_words = false, given_label = false;

  void bind(StageConfig& c) {
    given_min_words = c.bind("min_words", min_words, "fewest words kept");
    c.bind("partitions", partitions, "disk partitions");
    c.bind("ratio", ratio, "a ratio");
    c.bind("enabled", enabled, "whether it runs");
    given_label = c.bind("label", label, "the label");
    c.bind("languages", langs, "the languages");
    c.bind("limits", limits, "per n-gram size");
  }
};

StageConfig config(const std::string& yaml) {
  return StageConfig(YAML::Load(yaml), "pipeline.yaml", 2);
}

// The message of building the imaginary stage from `yaml` and finishing it.
std::string bind_error(const std::string& yaml) {
  return error_of([&] {
    StageConfig c = config(yaml);
    Fields f;
    f.bind(c);
    c.finish();
  });
}

TEST(StageConfig, BoundFieldsTakeGivenValuesAndKeepTheirDefaultsOtherwise) {
  StageConfig c = config(
      "type: demo\nmin_words: 7\nratio: 0.5\nenabled: false\nlanguages: [de, fr]\n"
      "limits: {3: 0.1, 4: 0.05}\n");
  Fields f;
  f.bind(c);
  c.finish();
  EXPECT_TRUE(f.given_min_words);
  EXPECT_FALSE(f.given_label);
  EXPECT_EQ(f.min_words, 7);
  EXPECT_EQ(f.partitions, 64u);
  EXPECT_EQ(f.ratio, 0.5);
  EXPECT_FALSE(f.enabled);
  EXPECT_EQ(f.label, "hq");
  EXPECT_EQ(f.langs, (std::vector<std::string>{"de", "fr"}));
  EXPECT_EQ(f.limits, (std::vector<std::pair<std::string, double>>{{"3", 0.1}, {"4", 0.05}}));
  // Bools also take YAML 1.1's spellings, as pipeline files always could.
  for (const char* no : {"no", "off", "0", "false"}) {
    StageConfig b = config(std::string("type: demo\nenabled: ") + no + "\n");
    Fields h;
    h.bind(b);
    EXPECT_FALSE(h.enabled) << no;
  }
  // A single scalar for a list is a list of one.
  StageConfig one = config("type: demo\nlanguages: ru\n");
  Fields g;
  g.bind(one);
  EXPECT_EQ(g.langs, (std::vector<std::string>{"ru"}));
}

TEST(StageConfig, KeysAreASchemaWithTypesDefaultsAndDocsInDeclarationOrder) {
  StageConfig c = config("type: demo\nmin_words: 9\n");
  Fields f;
  f.bind(c);
  const ConfigSchema& k = c.keys();
  std::vector<std::string> names;
  for (const auto& field : k.fields()) names.push_back(field.key);
  EXPECT_EQ(names, (std::vector<std::string>{"type", "name", "min_words", "partitions", "ratio",
                                             "enabled", "label", "languages", "limits"}));
  const auto& mw = k.fields()[k.index("min_words")];
  EXPECT_EQ(mw.type, ConfigType::Int);
  EXPECT_EQ(std::get<int64_t>(mw.def), 50);  // the field's value before binding
  EXPECT_EQ(mw.doc, "fewest words kept");
  EXPECT_EQ(k.fields()[k.index("ratio")].type, ConfigType::Float);
  EXPECT_EQ(k.fields()[k.index("enabled")].type, ConfigType::Bool);
  EXPECT_EQ(std::get<std::string>(k.fields()[k.index("languages")].def), "[en]");
  EXPECT_EQ(std::get<std::string>(k.fields()[k.index("limits")].def), "{2: 0.2}");
}

TEST(StageConfig, ScalarsParseAndFailAsTheTrainingConfigs) {
  // The same key in a training-style schema, set through Config, gives the
  // same words after the location.
  ConfigSchema s;
  s.add_int("min_words", 50, "").add_bool("enabled", true, "").add_float("ratio", 0.25, "");
  Config cfg = Config::defaults(s);
  auto config_error = [&](const std::string& key, const std::string& value) {
    return error_of([&] { cfg.set(key, value, "x"); });
  };
  std::string e = bind_error("type: demo\nmin_words: many\n");
  EXPECT_TRUE(contains(e,
                       "pipeline.yaml:2: stage 2 (demo): key 'min_words' expects an int, "
                       "got 'many'"))
      << e;
  EXPECT_TRUE(contains(config_error("min_words", "many"), e.substr(e.find("key '")))) << e;
  e = bind_error("type: demo\nenabled: maybe\n");
  EXPECT_TRUE(contains(e, "key 'enabled' expects a bool, got 'maybe'")) << e;
  EXPECT_TRUE(contains(config_error("enabled", "maybe"), e.substr(e.find("key '")))) << e;
  e = bind_error("type: demo\nratio: 1.5x\n");
  EXPECT_TRUE(contains(e, "key 'ratio' expects a float, got '1.5x'")) << e;
  EXPECT_TRUE(contains(config_error("ratio", "1.5x"), e.substr(e.find("key '")))) << e;
  // Values of the wrong shape, and ints out of the field's range.
  e = bind_error("type: demo\nmin_words: [1, 2]\n");
  EXPECT_TRUE(contains(e, "key 'min_words' expects int value, got a list")) << e;
  e = bind_error("type: demo\npartitions: -1\n");
  EXPECT_TRUE(contains(e, "key 'partitions' expects an int in 0..4294967295, got '-1'")) << e;
  e = bind_error("type: demo\nlanguages: {a: b}\n");
  EXPECT_TRUE(contains(e, "key 'languages': expected a list of strings")) << e;
  e = bind_error("type: demo\nlimits: {3: lots}\n");
  EXPECT_TRUE(contains(e, "key 'limits.3' expects a float, got 'lots'")) << e;
}

TEST(StageConfig, AnUnknownKeyNamesTheNearestDeclaredOneAsTheTrainingConfigDoes) {
  std::string e = bind_error("type: demo\nmin_words: 3\nmin_word: 5\n");
  EXPECT_TRUE(contains(e,
                       "pipeline.yaml:3: stage 2 (demo): unknown key 'min_word' (did you "
                       "mean 'min_words'?)"))
      << e;
  // The same message a training schema with these keys gives.
  StageConfig c = config("type: demo\n");
  Fields f;
  f.bind(c);
  EXPECT_EQ(config_unknown_key_message(c.keys(), "min_word", "at"),
            "at: unknown key 'min_word' (did you mean 'min_words'?)");
  // Nothing close: the keys the stage takes.
  e = bind_error("type: demo\nzzzzzzzzzzzz: 1\n");
  EXPECT_TRUE(contains(e,
                       "unknown key 'zzzzzzzzzzzz' (this stage takes: min_words, partitions, "
                       "ratio, enabled, label, languages, limits)"))
      << e;
  EXPECT_FALSE(contains(e, "did you mean")) << e;
  // `type` and `name` are keys of every stage.
  StageConfig named = config("type: demo\nname: first\n");
  named.finish();
  EXPECT_EQ(named.name(), "first");
}

TEST(StageConfig, RequiredKeysAndKeysDeclaredTwice) {
  std::string e = error_of([] {
    StageConfig c = config("type: demo\n");
    std::string model;
    c.bind_required("model", model, "the model");
  });
  EXPECT_TRUE(contains(e, "stage 2 (demo): missing key 'model'")) << e;
  e = error_of([] {
    StageConfig c = config("type: demo\nmodel: ''\n");
    std::string model;
    c.bind_required("model", model, "the model");
  });
  EXPECT_TRUE(contains(e, "key 'model': must not be empty")) << e;
  // Two bindings of one key would let one silently win: a bug, caught.
  StageConfig c = config("type: demo\n");
  int64_t a = 0, b = 0;
  c.bind("n", a, "one");
  EXPECT_THROW(c.bind("n", b, "two"), InternalError);
}

TEST(StageConfig, EveryKeyOfTheHeuristicFilterStagesHasADoc) {
  // Stages that need no files: each declares its keys with one-line docs.
  for (const char* type :
       {"gopher_quality", "gopher_repetition", "fineweb", "c4", "url_ratio", "non_alphanumeric",
        "boilerplate_strings", "clean", "html_to_text", "pii", "exact_dedup", "fuzzy_dedup"}) {
    StageConfig c(YAML::Load(std::string("type: ") + type), "pipeline.yaml", 1);
    const StageFactory& f = test_stage::factory(c);
    if (f.make_doc)
      f.make_doc(c);
    else
      f.make_global(c);
    EXPECT_GT(c.keys().fields().size(), 2u) << type;
    for (const auto& field : c.keys().fields()) EXPECT_FALSE(field.doc.empty()) << field.key;
  }
}

}  // namespace
}  // namespace nk::curate
