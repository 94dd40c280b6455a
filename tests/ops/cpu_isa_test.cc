// The CPU kernels' ISA levels (ops/cpu_isa.h, ops/cpu_kernels.h): NK_CPU_ISA's
// parser and its errors, the levels this CPU has, and that the level in use
// is the one NK_CPU_ISA names (ctest runs this binary again at each level the
// CPU has: test_ops_isa_<level>) or else the best available, with that
// level's own copy of the kernels.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iterator>
#include <string>
#include <vector>

#include "ops/cpu_isa.h"
#include "ops/cpu_kernels.h"
#include "ops/cpu_quant_paths.h"
#include "ops/ops.h"
#include "test_util.h"

namespace nk {
namespace {

using ops::CpuIsa;

// A run forced to a level this CPU lacks (test_ops_isa_<level> on an older
// CPU) skips every test: ctest reports it skipped by this line.
class IsaEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* cap = std::getenv("NK_CPU_ISA");
    if (!cap || !*cap) return;
    const auto isa = ops::parse_cpu_isa(cap);
    if (isa && !ops::cpu_isa_supported(*isa))
      GTEST_SKIP() << "NK_CPU_ISA_SKIP: this CPU lacks the level " << cap;
  }
};
[[maybe_unused]] ::testing::Environment* const kIsaEnv =
    ::testing::AddGlobalTestEnvironment(new IsaEnvironment);

TEST(CpuIsa, NamesParseBack) {
  for (CpuIsa i : ops::kCpuIsas) EXPECT_EQ(ops::parse_cpu_isa(ops::cpu_isa_name(i)), i);
  EXPECT_FALSE(ops::parse_cpu_isa("amx").has_value());
  EXPECT_FALSE(ops::parse_cpu_isa("AVX2").has_value());
  EXPECT_FALSE(ops::parse_cpu_isa("").has_value());
}

TEST(CpuIsa, NoCapTakesTheBestAvailable) {
  const std::vector<CpuIsa> all = {CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Avx512Bf16};
  const std::vector<CpuIsa> avx2 = {CpuIsa::Avx2};
  EXPECT_EQ(ops::choose_cpu_isa(nullptr, all), CpuIsa::Avx512Bf16);
  EXPECT_EQ(ops::choose_cpu_isa("", all), CpuIsa::Avx512Bf16);
  EXPECT_EQ(ops::choose_cpu_isa(nullptr, avx2), CpuIsa::Avx2);
  EXPECT_EQ(ops::choose_cpu_isa("avx2", all), CpuIsa::Avx2);
  EXPECT_EQ(ops::choose_cpu_isa("avx512", all), CpuIsa::Avx512);
}

TEST(CpuIsa, UnknownLevelIsAnErrorNamingTheVariableAndTheLevels) {
  const std::vector<CpuIsa> avx512 = {CpuIsa::Avx2, CpuIsa::Avx512};
  const std::string e = test::error_of([&] { ops::choose_cpu_isa("avx9", avx512); });
  EXPECT_TRUE(test::contains(e, "NK_CPU_ISA=avx9")) << e;
  EXPECT_TRUE(test::contains(e, "unknown level")) << e;
  EXPECT_TRUE(test::contains(e, "avx512_bf16")) << e;  // the build's levels
  EXPECT_TRUE(test::contains(e, "this CPU has: avx2, avx512")) << e;
}

TEST(CpuIsa, LevelTheCpuLacksIsAnErrorNamingWhatItHas) {
  const std::vector<CpuIsa> avx2 = {CpuIsa::Avx2};
  const std::string e = test::error_of([&] { ops::choose_cpu_isa("avx512", avx2); });
  EXPECT_TRUE(test::contains(e, "NK_CPU_ISA=avx512")) << e;
  EXPECT_TRUE(test::contains(e, "lacks")) << e;
  EXPECT_TRUE(test::contains(e, "it has: avx2")) << e;
  const std::string none = test::error_of([&] { ops::choose_cpu_isa(nullptr, {}); });
  EXPECT_TRUE(test::contains(none, "x86-64-v3")) << none;
}

// Levels are cumulative: a CPU with one has every lower one.
TEST(CpuIsa, AvailableLevelsAreAPrefix) {
  const auto avail = ops::cpu_isas_available();
  ASSERT_FALSE(avail.empty());  // the test binary itself runs x86-64-v3 code
  for (size_t i = 0; i < avail.size(); ++i) {
    EXPECT_EQ(avail[i], ops::kCpuIsas[i]);
    EXPECT_TRUE(ops::cpu_isa_supported(avail[i]));
  }
  for (size_t i = avail.size(); i < std::size(ops::kCpuIsas); ++i)
    EXPECT_FALSE(ops::cpu_isa_supported(ops::kCpuIsas[i]));
}

TEST(CpuIsa, ActiveLevelIsNkCpuIsaOrTheBest) {
  const char* cap = std::getenv("NK_CPU_ISA");
  const CpuIsa active = ops::active_cpu_isa();
  if (cap && *cap)
    EXPECT_STREQ(ops::cpu_isa_name(active), cap);
  else
    EXPECT_EQ(active, ops::cpu_isas_available().back());
  const std::string summary = ops::cpu_isa_summary();
  EXPECT_EQ(summary.rfind(ops::cpu_isa_name(active), 0), 0u) << summary;
  EXPECT_EQ(test::contains(summary, "capped by NK_CPU_ISA"), cap && *cap) << summary;
}

// The ops run the active level's copy: its table, whose kernels are not the
// other levels' (each copy is compiled apart, ops/cpu/level.h).
TEST(CpuIsa, OpsRunTheActiveLevelsOwnKernels) {
  const ops::CpuKernels& k = ops::cpu_kernels();
  EXPECT_EQ(&k, &ops::cpu_kernels_for(ops::active_cpu_isa()));
  for (CpuIsa a : ops::kCpuIsas)
    for (CpuIsa b : ops::kCpuIsas)
      if (a != b) {
        EXPECT_NE(ops::cpu_kernels_for(a).gelu_forward, ops::cpu_kernels_for(b).gelu_forward);
        EXPECT_NE(ops::cpu_kernels_for(a).linear_forward, ops::cpu_kernels_for(b).linear_forward);
      }
  // The quantised GEMM over byte tiles is the VNNI level's alone.
  EXPECT_FALSE(ops::cpu_quant_paths_avx2().gemm_available(ops::QuantType::Q8_0, 4096));
  EXPECT_FALSE(ops::cpu_quant_paths_avx512().gemm_available(ops::QuantType::Q8_0, 4096));
  if (ops::cpu_isa_supported(CpuIsa::Avx512Bf16)) {
    EXPECT_TRUE(ops::cpu_quant_paths_avx512_bf16().gemm_available(ops::QuantType::Q8_0, 4096));
  }
  // And an op gives the table's answer.
  Tensor x = Tensor::empty({4, 8}, DType::F32, Device::CPU);
  Tensor y = Tensor::empty({4, 8}, DType::F32, Device::CPU),
         z = Tensor::empty({4, 8}, DType::F32, Device::CPU);
  ops::fill(x, 0.5f);
  ops::gelu_forward(y, x);
  k.gelu_forward(z, x);
  std::vector<float> ya(32), za(32);
  ops::copy_to_host(y, ya.data());
  ops::copy_to_host(z, za.data());
  EXPECT_EQ(ya, za);
}

}  // namespace
}  // namespace nk
