#include "core/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"

namespace nk {
namespace fs = std::filesystem;

namespace {

ConfigSchema test_schema() {
  ConfigSchema s;
  s.add_int("model.n_layer", 12, "number of transformer blocks")
      .add_int("model.d_model", 768, "hidden size")
      .add_string("model.arch", "gpt2", "architecture name")
      .add_float("train.lr", 3e-4, "peak learning rate")
      .add_bool("train.bf16", true, "train in bf16 mixed precision")
      .add_int("train.opt.warmup", 100, "warmup steps")
      .add_int("seed", 1337, "random seed");
  return s;
}

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("nk_config_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    std::string p = (dir_ / name).string();
    std::ofstream(p) << text;
    return p;
  }
  // The nk::Error message from loading `yaml` (and overrides), or "" if none.
  std::string error_of(const std::string& yaml, const std::vector<std::string>& ov = {}) {
    std::string p = yaml.empty() ? "" : write("c.yaml", yaml);
    try {
      Config::load(test_schema(), p, ov);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

}  // namespace

TEST_F(ConfigTest, DefaultsFileOverridesPrecedence) {
  Config d = Config::defaults(test_schema());
  EXPECT_EQ(d.get_int("model.n_layer"), 12);
  EXPECT_DOUBLE_EQ(d.get_float("train.lr"), 3e-4);
  EXPECT_TRUE(d.get_bool("train.bf16"));
  EXPECT_EQ(d.get_string("model.arch"), "gpt2");

  std::string p = write("r.yaml",
                        "model:\n  n_layer: 4\n  arch: llama\ntrain:\n  lr: 1e-3\n  opt:\n"
                        "    warmup: 7\nseed: 5\n");
  Config c = Config::load(test_schema(), p, {"model.n_layer=2", "train.bf16=false", "seed=6"});
  EXPECT_EQ(c.get_int("model.n_layer"), 2);        // override beats file
  EXPECT_EQ(c.get_int("model.d_model"), 768);      // default survives
  EXPECT_EQ(c.get_string("model.arch"), "llama");  // file beats default
  EXPECT_DOUBLE_EQ(c.get_float("train.lr"), 1e-3);
  EXPECT_FALSE(c.get_bool("train.bf16"));
  EXPECT_EQ(c.get_int("train.opt.warmup"), 7);
  EXPECT_EQ(c.get_int("seed"), 6);
  // Later overrides win over earlier ones.
  Config c2 = Config::load(test_schema(), "", {"seed=1", "seed=2"});
  EXPECT_EQ(c2.get_int("seed"), 2);
}

// given(): set by the file or an override, even to the default's value; an
// older name of a key counts as the key.
TEST_F(ConfigTest, GivenTellsSetKeysFromDefaults) {
  ConfigSchema s = test_schema();
  s.add_alias("train.warmup", "train.opt.warmup");
  const std::string p = write("g.yaml", "model:\n  n_layer: 12\n");
  const Config c = Config::load(s, p, {"seed=1337", "train.warmup=3"});
  EXPECT_TRUE(c.given("model.n_layer"));  // the file, at the default's value
  EXPECT_TRUE(c.given("seed"));           // an override, at the default's value
  EXPECT_TRUE(c.given("train.opt.warmup"));
  EXPECT_TRUE(c.given("train.warmup"));
  EXPECT_FALSE(c.given("model.d_model"));
  EXPECT_FALSE(Config::defaults(s).given("seed"));
  EXPECT_THROW((void)c.given("model.n_layr"), InternalError);  // a bug: keys are declared
}

TEST_F(ConfigTest, DottedKeysInYamlAndEmptyFile) {
  Config c = Config::load(test_schema(), write("d.yaml", "model.n_layer: 3\ntrain:\n"), {});
  EXPECT_EQ(c.get_int("model.n_layer"), 3);
  Config e = Config::load(test_schema(), write("e.yaml", ""), {});
  EXPECT_EQ(e.get_int("seed"), 1337);
  Config f = Config::load(test_schema(), write("f.yaml", "# only a comment\n"), {});
  EXPECT_EQ(f.get_int("seed"), 1337);
}

TEST_F(ConfigTest, ValueSyntax) {
  Config c = Config::defaults(test_schema());
  c.set("train.lr", "3e-4", "");
  EXPECT_DOUBLE_EQ(c.get_float("train.lr"), 3e-4);
  c.set("train.lr", "2", "");  // floats accept integers
  EXPECT_DOUBLE_EQ(c.get_float("train.lr"), 2.0);
  c.set("seed", "-42", "");
  EXPECT_EQ(c.get_int("seed"), -42);
  c.set("seed", "9223372036854775807", "");
  EXPECT_EQ(c.get_int("seed"), INT64_MAX);
  c.set("model.arch", "", "");
  EXPECT_EQ(c.get_string("model.arch"), "");
  EXPECT_THROW(c.set("seed", "1.5", "x"), Error);
  EXPECT_THROW(c.set("seed", "12abc", "x"), Error);
  EXPECT_THROW(c.set("seed", "", "x"), Error);
  EXPECT_THROW(c.set("train.lr", "nan", "x"), Error);
  EXPECT_THROW(c.set("train.bf16", "yes", "x"), Error);
  EXPECT_THROW(c.set("train.bf16", "1", "x"), Error);
}

TEST_F(ConfigTest, MissingFile) {
  std::string p = (dir_ / "nope.yaml").string();
  try {
    Config::load(test_schema(), p, {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "config file '" + p + "' not found");
  }
}

TEST_F(ConfigTest, MalformedYamlNamesFileAndLine) {
  std::string msg = error_of("model:\n  n_layer: 4\n  d_model: [1, 2\n");
  EXPECT_NE(msg.find("c.yaml:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("invalid YAML"), std::string::npos) << msg;
  std::string msg2 = error_of("a: b: c\n");
  EXPECT_NE(msg2.find("c.yaml:1:"), std::string::npos) << msg2;
}

TEST_F(ConfigTest, UnknownKeyInFileSuggestsNearest) {
  std::string msg = error_of("seed: 1\nmodel:\n  n_layr: 4\n");
  EXPECT_NE(msg.find("c.yaml:3: unknown key 'model.n_layr' (did you mean 'model.n_layer'?)"),
            std::string::npos)
      << msg;
  // A misspelt section still finds the key.
  std::string msg2 = error_of("modle:\n  n_layer: 4\n");
  EXPECT_NE(msg2.find("c.yaml:2: unknown key 'modle.n_layer' (did you mean 'model.n_layer'?)"),
            std::string::npos)
      << msg2;
  // Nothing close: no suggestion.
  std::string msg3 = error_of("zzzzzzzzzz: 1\n");
  EXPECT_NE(msg3.find("c.yaml:1: unknown key 'zzzzzzzzzz'"), std::string::npos) << msg3;
  EXPECT_EQ(msg3.find("did you mean"), std::string::npos) << msg3;
}

TEST_F(ConfigTest, UnknownKeyInOverride) {
  std::string msg = error_of("", {"model.n_layr=4"});
  EXPECT_EQ(msg,
            "override 'model.n_layr=4': unknown key 'model.n_layr' (did you mean "
            "'model.n_layer'?)");
  EXPECT_NE(error_of("", {"model=4"}).find("is a section"), std::string::npos);
}

TEST_F(ConfigTest, WrongTypeNamesFileLineAndKey) {
  std::string p = (dir_ / "c.yaml").string();
  EXPECT_EQ(error_of("model:\n  n_layer: 4\n\ntrain:\n  lr: abc\n"),
            p + ":5: key 'train.lr' expects a float, got 'abc'");
  EXPECT_EQ(error_of("model:\n  n_layer: 1.5\n"),
            p + ":2: key 'model.n_layer' expects an int, got '1.5'");
  EXPECT_EQ(error_of("", {"train.bf16=maybe"}),
            "override 'train.bf16=maybe': key 'train.bf16' expects a bool, got 'maybe'");
}

TEST_F(ConfigTest, OverrideWithoutEquals) {
  std::string msg = error_of("", {"model.n_layer"});
  EXPECT_NE(msg.find("override 'model.n_layer'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("key=value"), std::string::npos) << msg;
  EXPECT_NE(error_of("", {"=3"}).find("missing key"), std::string::npos);
}

TEST_F(ConfigTest, NonScalarWhereScalarExpected) {
  std::string msg = error_of("model:\n  n_layer: [1, 2]\n");
  EXPECT_NE(msg.find("c.yaml:2: key 'model.n_layer' expects int value, got a list"),
            std::string::npos)
      << msg;
  std::string msg2 = error_of("seed:\n  a: 1\n");
  EXPECT_NE(msg2.find("key 'seed'"), std::string::npos) << msg2;
  std::string msg3 = error_of("model: 5\n");
  EXPECT_NE(msg3.find("c.yaml:1: 'model' is a section"), std::string::npos) << msg3;
  std::string msg4 = error_of("- 1\n- 2\n");
  EXPECT_NE(msg4.find("top level must be a map"), std::string::npos) << msg4;
}

TEST_F(ConfigTest, ListForStringKeyJoinsItems) {
  // NeMo-style blends are YAML lists; a string key reads them comma-joined.
  std::string p = write("l.yaml", "model:\n  arch: [0.3, a/b, 0.7, c]\n");
  Config c = Config::load(test_schema(), p, {});
  EXPECT_EQ(c.get_string("model.arch"), "0.3,a/b,0.7,c");
  std::string msg = error_of("model:\n  arch: [1, [2]]\n");
  EXPECT_NE(msg.find("c.yaml:2: key 'model.arch' expects a list of plain values"),
            std::string::npos)
      << msg;
}

TEST_F(ConfigTest, IntOutOfRange) {
  std::string msg = error_of("seed: 99999999999999999999\n");
  EXPECT_NE(msg.find("c.yaml:1: key 'seed' value '99999999999999999999' is out of int64 range"),
            std::string::npos)
      << msg;
  EXPECT_NE(error_of("", {"seed=-99999999999999999999"}).find("out of int64 range"),
            std::string::npos);
}

TEST_F(ConfigTest, HelpListsEveryKey) {
  ConfigSchema s = test_schema();
  std::string h = s.help();
  for (const auto& f : s.fields()) {
    EXPECT_NE(h.find(f.key), std::string::npos) << f.key;
    EXPECT_NE(h.find(f.doc), std::string::npos) << f.doc;
  }
  EXPECT_NE(h.find("model:\n"), std::string::npos) << h;
  EXPECT_NE(h.find("train:\n"), std::string::npos) << h;
  EXPECT_NE(h.find("0.0003"), std::string::npos) << h;
  EXPECT_NE(h.find("'gpt2'"), std::string::npos) << h;
  EXPECT_NE(h.find("1337"), std::string::npos) << h;
  // Aligned: the doc column starts at the same offset on every key line.
  size_t col = std::string::npos;
  std::istringstream lines(h);
  for (std::string line; std::getline(lines, line);) {
    for (const auto& f : s.fields()) {
      if (line.find("  " + f.key + " ") != 0) continue;
      size_t at = line.find(f.doc);
      if (col == std::string::npos) col = at;
      EXPECT_EQ(at, col) << line;
    }
  }
}

TEST_F(ConfigTest, ToYamlRoundTrips) {
  Config c = Config::load(test_schema(), "",
                          {"model.arch=true", "train.lr=1", "seed=-3", "train.opt.warmup=0",
                           "train.bf16=false", "model.d_model=64"});
  std::string y = c.to_yaml();
  EXPECT_NE(y.find("model:"), std::string::npos) << y;
  Config back = Config::load(test_schema(), write("rt.yaml", y), {});
  EXPECT_EQ(back.to_yaml(), y);
  EXPECT_EQ(back.get_string("model.arch"), "true");
  EXPECT_DOUBLE_EQ(back.get_float("train.lr"), 1.0);
  EXPECT_EQ(back.get_int("seed"), -3);
  EXPECT_FALSE(back.get_bool("train.bf16"));
  EXPECT_EQ(back.get_int("model.d_model"), 64);
  // Awkward strings survive too.
  Config s = Config::defaults(test_schema());
  s.set("model.arch", "a: b # c \"q\" 'x'\n", "");
  Config s2 = Config::load(test_schema(), write("rt2.yaml", s.to_yaml()), {});
  EXPECT_EQ(s2.get_string("model.arch"), "a: b # c \"q\" 'x'\n");
  // Floats keep full precision.
  s.set("train.lr", "0.1234567890123456789", "");
  Config s3 = Config::load(test_schema(), write("rt3.yaml", s.to_yaml()), {});
  EXPECT_EQ(s3.get_float("train.lr"), s.get_float("train.lr"));
}

TEST_F(ConfigTest, NearestKey) {
  ConfigSchema s = test_schema();
  EXPECT_EQ(s.nearest_key("model.n_layr"), "model.n_layer");
  EXPECT_EQ(s.nearest_key("n_layer"), "model.n_layer");  // last component alone
  EXPECT_EQ(s.nearest_key("lr"), "train.lr");
  EXPECT_EQ(s.nearest_key("train.warmup"), "train.opt.warmup");
  EXPECT_EQ(s.nearest_key("sed"), "seed");
  EXPECT_EQ(s.nearest_key("completely_unrelated"), "");
  EXPECT_TRUE(s.has("train.lr"));
  EXPECT_FALSE(s.has("train"));
  EXPECT_TRUE(s.is_section("train"));
}

TEST_F(ConfigTest, GettersCheckTypeAndKey) {
  Config c = Config::defaults(test_schema());
  EXPECT_THROW(c.get_int("train.lr"), InternalError);
  EXPECT_THROW(c.get_int("nope"), InternalError);
  ConfigSchema bad;
  bad.add_int("a.b", 1, "x");
  EXPECT_THROW(bad.add_int("a", 1, "x"), InternalError);
  EXPECT_THROW(bad.add_int("a.b.c", 1, "x"), InternalError);
  EXPECT_THROW(bad.add_int("a.b", 1, "x"), InternalError);
}

// Comma-separated values (preprocess.input, peft.target_modules, curate's
// input lists): items trimmed, empty ones dropped.
TEST(SplitCommas, TrimsAndDropsEmptyItems) {
  EXPECT_EQ(split_commas(" q_proj, v_proj ,,\tdown_proj"),
            (std::vector<std::string>{"q_proj", "v_proj", "down_proj"}));
  EXPECT_EQ(split_commas("a b"), (std::vector<std::string>{"a b"}));
  EXPECT_TRUE(split_commas("").empty());
  EXPECT_TRUE(split_commas(" , ").empty());
}

}  // namespace nk
