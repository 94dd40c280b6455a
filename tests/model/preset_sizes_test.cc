// Presets overridden in part (model_config.h, bind_model_keys): sizes that
// follow from an overridden one are derived by the family's rule unless set
// too, and a value the preset's proportions cannot fit is an error naming the
// key. The expected sizes are worked out here from each family's published
// rule, not from the code's.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/config.h"
#include "model/model_config.h"
#include "test_util.h"

namespace nk {
namespace {

using test::contains;
using test::error_of;

ModelConfig from(const std::vector<std::string>& o) {
  return model_config_from(Config::load(model_schema(), "", o));
}

// Meta's Llama MLP width: 2/3 of 4 d, times ffn_dim_multiplier, rounded up
// to multiple_of (llama/model.py's FeedForward).
int64_t meta_ffn(int64_t d, double multiplier, int64_t multiple_of) {
  int64_t h = int64_t(2 * 4 * d / 3);
  h = int64_t(multiplier * double(h));
  return multiple_of * ((h + multiple_of - 1) / multiple_of);
}

std::string rule_of(const ModelConfig& m, const std::string& key) {
  for (const DerivedField& d : m.derived)
    if (d.key == key) return d.rule;
  return "";
}

struct Case {
  std::string preset;
  int64_t d_model, n_head, n_kv_head, d_ff;
};

TEST(PresetSizes, DModelAloneDerivesHeadsAndMlpByTheFamilyRule) {
  const std::vector<Case> cases = {
      // GPT-2: heads of 64, MLP 4 d (n_inner's default).
      {"gpt2-124m", 512, 8, 8, 4 * 512},
      {"gpt2-1.5b", 1280, 20, 20, 4 * 1280},
      // Llama 2 7B: heads of 128, multi-head; MLP by Meta's rule, multiplier 1.
      {"llama2-7b", 512, 4, 4, meta_ffn(512, 1.0, 256)},
      // Llama 3.2 1B: heads of 64, 4 query heads per kv head; multiplier 1.5.
      {"llama-1b", 1024, 16, 4, meta_ffn(1024, 1.5, 256)},
      // Mistral 7B: heads of 128, groups of 4, MLP 3.5 d.
      {"mistral-7b", 2048, 16, 4, 7168},
      // Qwen2.5 0.5B: heads of 64, groups of 7, MLP 4864 / 896 d rounded to 256.
      {"qwen2-0.5b", 448, 7, 1, 2560},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.preset);
    const ModelConfig m =
        from({"model.preset=" + c.preset, "model.d_model=" + std::to_string(c.d_model)});
    EXPECT_EQ(m.d_model, c.d_model);
    EXPECT_EQ(m.n_head, c.n_head);
    EXPECT_EQ(m.n_kv_head, c.n_kv_head);
    EXPECT_EQ(m.d_ff, c.d_ff);
    EXPECT_FALSE(rule_of(m, "model.n_head").empty());
    EXPECT_FALSE(rule_of(m, "model.d_ff").empty());
    EXPECT_TRUE(rule_of(m, "model.d_model").empty());  // given, not derived
  }
  // The rule reproduces every preset from its own width.
  for (const std::string& p : model_preset_names()) {
    SCOPED_TRACE(p);
    const ModelConfig want = model_preset(p);
    const ModelConfig m =
        from({"model.preset=" + p, "model.d_model=" + std::to_string(want.d_model)});
    EXPECT_EQ(m.n_head, want.n_head);
    EXPECT_EQ(m.n_kv_head, want.n_kv_head);
    EXPECT_EQ(m.d_ff, want.d_ff);
  }
}

TEST(PresetSizes, FieldsSetTooAreKept) {
  ModelConfig m =
      from({"model.preset=llama-1b", "model.d_model=1024", "model.n_head=8", "model.d_ff=3000"});
  EXPECT_EQ(m.n_head, 8);
  EXPECT_EQ(m.n_kv_head, 2);  // the preset's groups of 4
  EXPECT_EQ(m.d_ff, 3000);
  EXPECT_TRUE(rule_of(m, "model.n_head").empty());
  EXPECT_TRUE(rule_of(m, "model.d_ff").empty());
  EXPECT_TRUE(contains(rule_of(m, "model.n_kv_head"), "n_head / 4"))
      << rule_of(m, "model.n_kv_head");

  m = from({"model.preset=llama-1b", "model.d_model=1024", "model.n_kv_head=16"});
  EXPECT_EQ(m.n_head, 16);
  EXPECT_EQ(m.n_kv_head, 16);
  // n_head alone keeps the width and the MLP; the groups follow it.
  m = from({"model.preset=llama-tiny", "model.n_head=8"});
  EXPECT_EQ(m.d_model, 64);
  EXPECT_EQ(m.d_ff, 176);
  EXPECT_EQ(m.n_kv_head, 4);
  // Nothing overridden: nothing derived.
  m = from({"model.preset=gpt2-124m"});
  EXPECT_TRUE(m.derived.empty());
  EXPECT_EQ(m.d_ff, 3072);
}

TEST(PresetSizes, ProportionsThatDoNotFitNameTheKey) {
  std::string e = error_of([] { from({"model.preset=llama-1b", "model.d_model=1000"}); });
  EXPECT_TRUE(contains(e, "model.d_model: 1000 is not a multiple of the preset's head size 64"))
      << e;
  EXPECT_TRUE(contains(e, "set model.n_head too")) << e;
  e = error_of([] { from({"model.preset=llama-1b", "model.n_head=30"}); });
  EXPECT_TRUE(contains(e, "model.n_head: 30 heads do not split into the preset's groups of 4"))
      << e;
  EXPECT_TRUE(contains(e, "set model.n_kv_head too")) << e;
}

}  // namespace
}  // namespace nk
