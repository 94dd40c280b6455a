// ConfigBinder: one line per key declares it (type, default, doc) and binds
// it to its field; the same bind function makes the schema and fills the struct.
#include "core/config_bind.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "test_util.h"

namespace nk {
namespace {

using test::contains;
using test::error_of;

enum class Mode { Fast, Exact };

// A settings struct as the training config's: every key bound in one line.
struct Settings {
  int64_t steps = 100;
  int32_t threads = 0;
  double lr = 3e-4;
  bool shuffle = true;
  std::string out = "runs/x";
  Mode mode = Mode::Fast;
  int64_t layers = 12;  // a preset's; run.layers=0 keeps it

  void bind(ConfigBinder& b) {
    b.bind("run.steps", steps, "optimizer steps");
    b.bind("run.threads", threads, "CPU threads (0 = all)");
    b.bind("opt.lr", lr, "peak learning rate");
    b.bind("run.shuffle", shuffle, "shuffle the data");
    b.bind("run.out", out, "output folder");
    b.bind_with<std::string>("run.mode", mode == Mode::Fast ? "fast" : "exact", "fast or exact",
                             [&](const std::string& m) {
                               if (m != "fast" && m != "exact")
                                 fail("run.mode: expected fast or exact, got '{}'", m);
                               mode = m == "fast" ? Mode::Fast : Mode::Exact;
                             });
    b.bind_unless("run.layers", layers, 0, "override: layers (0 = the preset's)");
  }
};

ConfigSchema settings_schema() {
  return schema_of([](ConfigBinder& b) { Settings().bind(b); });
}

Settings settings_from(const std::vector<std::string>& overrides) {
  Config c = Config::load(settings_schema(), "", overrides);
  Settings s;
  ConfigReader r(c);
  s.bind(r);
  return s;
}

TEST(ConfigBind, TheBindListIsTheSchemaWithTypesDefaultsAndDocsInOrder) {
  ConfigSchema s = settings_schema();
  std::vector<std::string> keys;
  for (const auto& f : s.fields()) keys.push_back(f.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"run.steps", "run.threads", "opt.lr", "run.shuffle",
                                            "run.out", "run.mode", "run.layers"}));
  const auto& lr = s.fields()[s.index("opt.lr")];
  EXPECT_EQ(lr.type, ConfigType::Float);
  EXPECT_EQ(std::get<double>(lr.def), 3e-4);  // the field's value before binding
  EXPECT_EQ(lr.doc, "peak learning rate");
  EXPECT_EQ(s.fields()[s.index("run.threads")].type, ConfigType::Int);
  EXPECT_EQ(s.fields()[s.index("run.shuffle")].type, ConfigType::Bool);
  EXPECT_EQ(std::get<std::string>(s.fields()[s.index("run.mode")].def), "fast");
  EXPECT_EQ(std::get<int64_t>(s.fields()[s.index("run.layers")].def), 0);  // the unset value
  // --help shows every key with its doc.
  std::string help = s.help();
  for (const char* doc : {"optimizer steps", "peak learning rate", "override: layers"})
    EXPECT_TRUE(contains(help, doc)) << help;
  EXPECT_TRUE(contains(help, "run.out")) << help;
}

TEST(ConfigBind, AReaderFillsEveryBoundFieldFromTheConfig) {
  Settings d = settings_from({});
  EXPECT_EQ(d.steps, 100);
  EXPECT_EQ(d.lr, 3e-4);
  EXPECT_EQ(d.layers, 12);  // 0 keeps the field's value
  Settings s = settings_from({"run.steps=7", "run.threads=4", "opt.lr=0.01", "run.shuffle=false",
                              "run.out=o", "run.mode=exact", "run.layers=3"});
  EXPECT_EQ(s.steps, 7);
  EXPECT_EQ(s.threads, 4);
  EXPECT_EQ(s.lr, 0.01);
  EXPECT_FALSE(s.shuffle);
  EXPECT_EQ(s.out, "o");
  EXPECT_EQ(s.mode, Mode::Exact);
  EXPECT_EQ(s.layers, 3);
  // A declaring binder leaves the fields alone.
  Settings untouched;
  untouched.steps = 5;
  ConfigBinder declare;
  untouched.bind(declare);
  EXPECT_EQ(untouched.steps, 5);
  EXPECT_FALSE(declare.reading());
}

TEST(ConfigBind, ErrorsNameTheKey) {
  std::string e = error_of([] { settings_from({"run.steps=many"}); });
  EXPECT_EQ(e, "override 'run.steps=many': key 'run.steps' expects an int, got 'many'");
  // An int field narrower than int64: the range is the field's.
  e = error_of([] { settings_from({"run.threads=3000000000"}); });
  EXPECT_EQ(e, "key 'run.threads' expects an int in -2147483648..2147483647, got '3000000000'");
  // A converting bind checks the value with its own message.
  e = error_of([] { settings_from({"run.mode=slow"}); });
  EXPECT_EQ(e, "run.mode: expected fast or exact, got 'slow'");
  // An unknown key names the nearest bound one.
  e = error_of([] { settings_from({"run.stesp=3"}); });
  EXPECT_EQ(e, "override 'run.stesp=3': unknown key 'run.stesp' (did you mean 'run.steps'?)");
  // Binding a key twice would let one field silently win: a bug, caught.
  EXPECT_THROW(schema_of([](ConfigBinder& b) {
                 int64_t a = 0, c = 0;
                 b.bind("k", a, "one");
                 b.bind("k", c, "two");
               }),
               InternalError);
}

TEST(ConfigBind, BindOnlyTakesSomeKeysOfASharedGroupWithTheirOwnDocs) {
  Settings s;
  ConfigSchema only = schema_of([&](ConfigBinder& b) {
    b.bind_only({{"run.out", "where this command writes"}, {"opt.lr", ""}},
                [&](ConfigBinder& g) { s.bind(g); });
  });
  ASSERT_EQ(only.fields().size(), 2u);
  EXPECT_EQ(only.fields()[0].key, "opt.lr");  // the group's order
  EXPECT_EQ(only.fields()[0].doc, "peak learning rate");
  EXPECT_EQ(only.fields()[1].doc, "where this command writes");
  // Picking a key the group does not bind is a bug.
  EXPECT_THROW(schema_of([&](ConfigBinder& b) {
                 b.bind_only({{"run.nope", ""}}, [&](ConfigBinder& g) { s.bind(g); });
               }),
               InternalError);
}

TEST(ConfigBind, AnOlderNameSetsItsKeyAndIsListedButNeverSaved) {
  ConfigSchema s = schema_of([](ConfigBinder& b) {
    Settings().bind(b);
    b.alias("run.output", "run.out");
  });
  Config c = Config::load(s, "", {"run.output=old"});
  EXPECT_EQ(c.get_string("run.out"), "old");
  EXPECT_FALSE(contains(c.to_yaml(), "output")) << c.to_yaml();
  EXPECT_TRUE(contains(s.help(), "run.output")) << s.help();
  EXPECT_TRUE(contains(s.help(), "older name of run.out")) << s.help();
  EXPECT_EQ(s.resolve("run.output"), "run.out");
  EXPECT_EQ(s.resolve("run.out"), "run.out");
  EXPECT_EQ(s.resolve("run.nope"), "");
  // In a YAML recipe too.
  test::TempDir dir("nk_config_bind");
  test::write_file(dir / "r.yaml", "run:\n  output: from_yaml\n");
  EXPECT_EQ(Config::load(s, dir / "r.yaml", {}).get_string("run.out"), "from_yaml");
  // Its value parses as the key's type, named as the user wrote it.
  ConfigSchema t = schema_of([](ConfigBinder& b) {
    Settings().bind(b);
    b.alias("run.max_steps", "run.steps");
  });
  EXPECT_EQ(error_of([&] { Config::load(t, "", {"run.max_steps=x"}); }),
            "override 'run.max_steps=x': key 'run.max_steps' expects an int, got 'x'");
}

}  // namespace
}  // namespace nk
