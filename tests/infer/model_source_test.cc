// load_runnable_model's choice for a bf16 model folder: bf16 rows
// (ops::QuantType::BF16) where the CPU's kernels have no bf16 dot product,
// dense where they have one or the user says quantize=none, and the same
// model either way (the logits, or a reward model's scores, within the
// 2-byte types' bound of tests/model/quantized_model_test.cc).
#include "infer/model_source.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <utility>

#include "align/reward_model.h"
#include "ckpt/model_io.h"
#include "model/full_logits.h"
#include "model/tiny_config.h"
#include "test_util.h"

namespace nk {
namespace {

namespace fs = std::filesystem;
using ops::CpuIsa;

bool any_quantized(const Transformer& m) {
  for (const ParamInfo& p : m.layout().params())
    if (p.quantized) return true;
  return false;
}

TEST(ModelSource, Bf16RowsByDefaultOnlyBelowAvx512Bf16) {
  ModelSourceKeys k;
  k.model = "/models/m";
  EXPECT_TRUE(bf16_rows_by_default(k, DType::BF16, CpuIsa::Avx2));
  EXPECT_TRUE(bf16_rows_by_default(k, DType::BF16, CpuIsa::Avx512));
  EXPECT_FALSE(bf16_rows_by_default(k, DType::BF16, CpuIsa::Avx512Bf16));
  EXPECT_FALSE(bf16_rows_by_default(k, DType::F32, CpuIsa::Avx2));
  for (const char* q : {"none", "q8_0", "bf16"}) {
    ModelSourceKeys given = k;
    given.quantize = q;
    EXPECT_FALSE(bf16_rows_by_default(given, DType::BF16, CpuIsa::Avx2)) << q;
  }
  ModelSourceKeys adapter = k, gguf = k;
  adapter.adapter = "/adapters/a";  // adapters apply to dense models only
  gguf.model = "/models/m.gguf";    // a GGUF keeps its own types
  EXPECT_FALSE(bf16_rows_by_default(adapter, DType::BF16, CpuIsa::Avx2));
  EXPECT_FALSE(bf16_rows_by_default(gguf, DType::BF16, CpuIsa::Avx2));
}

// The folder of `c` (random weights) loaded in bf16 as load_runnable_model
// chooses, and with quantize=none: the first holds bf16 rows exactly where
// the CPU's kernels are below avx512_bf16, the second never.
std::pair<RunnableModel, RunnableModel> load_both(const ModelConfig& c, const fs::path& dir) {
  Transformer src(c, DType::F32, 5);
  save_model(dir.string(), src);
  ModelSourceKeys k;
  k.prefix = "generate";
  k.model = dir.string();
  k.dtype = "bf16";
  RunnableModel chosen = load_runnable_model(k);
  k.quantize = "none";
  RunnableModel dense = load_runnable_model(k);
  EXPECT_EQ(any_quantized(*chosen.model), ops::active_cpu_isa() < CpuIsa::Avx512Bf16)
      << ops::cpu_isa_summary();
  EXPECT_FALSE(any_quantized(*dense.model));
  return {std::move(chosen), std::move(dense)};
}

// A causal LM: the logits of both within the 2-byte types' bound.
TEST(ModelSource, Bf16FolderLoadsAsBf16RowsWhereTheCpuHasNoBf16Dot) {
  test::TempDir d("nk_model_source");
  auto [chosen, dense] = load_both(test::tiny_config(true, 257, 32), d.path() / "m");
  const std::vector<int32_t> toks = {1, 72, 101, 108, 108, 111, 256, 0};
  EXPECT_LE(test::rel_max_diff(test::full_logits(*chosen.model, toks),
                               test::full_logits(*dense.model, toks)),
            0.05);
}

// A reward model (align's scorers load through the same path): its score
// head is one of the matrices held as bf16 rows, and the scores agree.
TEST(ModelSource, Bf16RewardModelScoresAlike) {
  test::TempDir d("nk_model_source");
  ModelConfig c = test::tiny_config(true, 257, 32);
  c.num_labels = 3;
  auto [chosen, dense] = load_both(c, d.path() / "rm");
  EXPECT_EQ(chosen.model->layout().find("score.weight").quantized,
            ops::active_cpu_isa() < CpuIsa::Avx512Bf16);
  const std::vector<std::vector<int32_t>> seqs = {
      {1, 72, 101, 108, 108, 111}, {200, 3, 9}, {42, 42, 42, 42, 42, 42, 42, 42, 7}};
  std::vector<float> a, b;
  for (const auto& row : score_sequences(*chosen.model, seqs))
    a.insert(a.end(), row.begin(), row.end());
  for (const auto& row : score_sequences(*dense.model, seqs))
    b.insert(b.end(), row.begin(), row.end());
  ASSERT_EQ(a.size(), 9u);
  EXPECT_LE(test::rel_max_diff(a, b), 0.05);
}

}  // namespace
}  // namespace nk
