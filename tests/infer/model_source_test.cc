// load_runnable_model's choice for a bf16 model folder: bf16 rows
// (ops::QuantType::BF16) where the CPU's kernels have no bf16 dot product,
// dense where they have one or the user says quantize=none, and the same
// model either way (the logits within the 2-byte types' bound of
// tests/model/quantized_model_test.cc).
#include "infer/model_source.h"

#include <gtest/gtest.h>

#include <cmath>

#include "ckpt/model_io.h"
#include "model/full_logits.h"
#include "model/tiny_config.h"
#include "test_util.h"

namespace nk {
namespace {

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

TEST(ModelSource, Bf16FolderLoadsAsBf16RowsWhereTheCpuHasNoBf16Dot) {
  test::TempDir d("nk_model_source");
  ModelConfig c = test::tiny_config(true, 257, 32);  // the bytes tokenizer's 257 ids
  Transformer src(c, DType::F32, 5);
  const std::string dir = (d.path() / "m").string();
  save_model(dir, src);
  ModelSourceKeys k;
  k.prefix = "generate";
  k.model = dir;
  k.dtype = "bf16";
  RunnableModel chosen = load_runnable_model(k);
  k.quantize = "none";
  RunnableModel dense = load_runnable_model(k);
  EXPECT_EQ(any_quantized(*chosen.model), ops::active_cpu_isa() < CpuIsa::Avx512Bf16)
      << ops::cpu_isa_summary();
  EXPECT_FALSE(any_quantized(*dense.model));
  const std::vector<int32_t> toks = {1, 72, 101, 108, 108, 111, 256, 0};
  const std::vector<float> a = test::full_logits(*chosen.model, toks),
                           b = test::full_logits(*dense.model, toks);
  double m = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, double(std::fabs(a[i] - b[i])));
    s += double(b[i]) * b[i];
  }
  EXPECT_LE(m / std::sqrt(s / double(b.size())), 0.05);
}

}  // namespace
}  // namespace nk
