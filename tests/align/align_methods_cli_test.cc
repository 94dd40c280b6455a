// The other ways `nekton align` runs: from a Hugging Face folder (imported
// on the fly) with a LoRA policy whose reference is its base with the
// adapters off, from a Nekton model folder with a frozen copy or precomputed
// values as reference, KTO on unpaired data, and ORPO and SimPO without a
// reference. At the first step the policy is its reference, so the rewards
// start at 0 (exactly with the adapters off). Settings that do not fit are
// refused before anything is written.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "test_util.h"

namespace nk {
namespace {

using test::contains;
using test::TempDir;
namespace fs = std::filesystem;

std::string word(Rng& rng, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += char('a' + rng.below(26));
  return s;
}

// The first metrics record of a run.
nlohmann::json first_record(const std::string& out) {
  const std::string text = test::read_file(out + "/metrics.jsonl");
  return nlohmann::json::parse(text.substr(0, text.find('\n')));
}

struct Runs {
  TempDir dir{"nk_align_methods"};
  Runs() {
    Rng rng(5);
    std::string pairs, kto;
    for (int i = 0; i < 24; ++i) {
      pairs += fmt::format(R"({{"prompt": "say {}:", "chosen": " END", "rejected": "{}"}})"
                           "\n",
                           word(rng, 3), word(rng, 4));
      kto += fmt::format(R"({{"prompt": "say {}:", "completion": "{}", "label": {}}})"
                         "\n",
                         word(rng, 3), i % 2 ? " END" : word(rng, 4), i % 2 ? "true" : "false");
    }
    test::write_file(dir / "pairs.jsonl", pairs);
    test::write_file(dir / "kto.jsonl", kto);
  }
  test::RunResult align(const std::string& out, const std::string& extra) const {
    return test::run_nekton(
        "align train.dtype=f32 train.seq_len=16 train.micro_batch=8 train.global_batch=8 "
        "train.steps=4 train.lr=1e-3 train.warmup_steps=0 train.peak_tflops=1 train.threads=2 "
        "train.val_every=0 train.out_dir=" +
        out + " " + extra);
  }
};

TEST(AlignMethodsCli, ReferencesAndMethods) {
  Runs r;
  const std::string pairs = " align.data_path=" + (r.dir / "pairs.jsonl");
  // A model to start from, and its Hugging Face export.
  const std::string base = r.dir / "base";
  test::RunResult b = r.align(base, "model.preset=llama-tiny" + pairs);
  ASSERT_EQ(b.code, 0) << b.out;
  b = test::run_nekton("export hf " + base + "/model " + (r.dir / "hf"));
  ASSERT_EQ(b.code, 0) << b.out;

  {  // LoRA from the Hugging Face folder: the reference is the base (adapters off).
    const std::string out = r.dir / "lora";
    const test::RunResult x = r.align(out, "train.init_from=" + (r.dir / "hf") +
                                               " data.tokenizer=bytes peft.method=lora" + pairs);
    ASSERT_EQ(x.code, 0) << x.out;
    EXPECT_TRUE(contains(x.out, "imported the Hugging Face model")) << x.out;
    EXPECT_TRUE(contains(x.out, "adapters switched off")) << x.out;
    const nlohmann::json rec = first_record(out);
    // LoRA's B starts at 0: the policy is its base bit for bit at step 1.
    EXPECT_EQ(rec["rewards/chosen"].get<double>(), 0.0) << rec.dump();
    EXPECT_EQ(rec["rewards/margins"].get<double>(), 0.0) << rec.dump();
    EXPECT_TRUE(fs::exists(out + "/adapter/adapter_model.safetensors"));
    EXPECT_FALSE(fs::exists(out + "/reference_logps.json"));
  }
  {  // Full fine-tuning from the Nekton folder with a frozen copy.
    const std::string out = r.dir / "copy";
    const test::RunResult x =
        r.align(out, "train.init_from=" + base + "/model align.reference=copy" + pairs);
    ASSERT_EQ(x.code, 0) << x.out;
    EXPECT_TRUE(contains(x.out, "frozen copy of the initial model")) << x.out;
    EXPECT_NEAR(first_record(out)["rewards/margins"].get<double>(), 0.0, 1e-6);
  }
  {  // Precomputed values (the default for full fine-tuning).
    const std::string out = r.dir / "pre";
    const test::RunResult x =
        r.align(out, "train.init_from=" + base + "/model align.method=ipo" + pairs);
    ASSERT_EQ(x.code, 0) << x.out;
    EXPECT_TRUE(fs::exists(out + "/reference_logps.json"));
    EXPECT_NEAR(first_record(out)["rewards/margins"].get<double>(), 0.0, 1e-6);
  }
  {  // KTO: its KL estimate, no accuracy.
    const std::string out = r.dir / "kto";
    const test::RunResult x =
        r.align(out, "train.init_from=" + base +
                         "/model align.method=kto align.data_path=" + (r.dir / "kto.jsonl"));
    ASSERT_EQ(x.code, 0) << x.out;
    const nlohmann::json rec = first_record(out);
    EXPECT_TRUE(rec.contains("kl")) << rec.dump();
    EXPECT_FALSE(rec.contains("rewards/accuracies")) << rec.dump();
    EXPECT_NEAR(rec["kl"].get<double>(), 0.0, 1e-6);
  }
  for (const std::string m : {"orpo", "simpo"}) {  // no reference at all
    const std::string out = r.dir / m;
    const test::RunResult x =
        r.align(out, "train.init_from=" + base + "/model align.method=" + m + pairs);
    ASSERT_EQ(x.code, 0) << x.out;
    EXPECT_TRUE(contains(x.out, "needs no reference model")) << x.out;
    EXPECT_FALSE(fs::exists(out + "/reference_logps.json"));
    EXPECT_EQ(first_record(out).contains("nll_loss"), m == "orpo");
  }
  // Settings that do not fit are refused before anything is written.
  const std::string bad = r.dir / "bad";
  for (const std::string extra :
       {"align.reference=adapter_off", "align.method=orpo align.rpo_alpha=1",
        "align.method=kto align.loss_type=ipo", "parallel.tp=2", "data.sft_path=x.jsonl",
        "align.label_smoothing=0.5"}) {
    const test::RunResult x = r.align(bad, "model.preset=llama-tiny " + extra + pairs);
    EXPECT_NE(x.code, 0) << extra;
    EXPECT_FALSE(fs::exists(bad)) << extra << "\n" << x.out;
  }
}

}  // namespace
}  // namespace nk
