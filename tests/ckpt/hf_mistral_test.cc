// Mistral (Llama's block with sliding-window attention) through Hugging Face
// import/export, checked against the independent reference
// (tests/ckpt/hf_reference.py masks keys outside the window, as transformers'
// sliding-window mask does: query t sees keys s with t - window < s <= t).
// The window (5) is much shorter than the 16-token test rows, so most
// positions lose keys to it; the same weights with full attention give
// logits far outside the tolerance, so the check is not vacuous.
// Tolerance 1e-5 relative in fp32, as for Qwen2 (hf_arch_test.cc).
#include <gtest/gtest.h>

#include "hf_test_util.h"
#include "infer/generate.h"
#include "model/arch.h"

namespace nk {
namespace {

using namespace nk::test;
using nlohmann::json;

constexpr double kTol = 1e-5;

json mistral_spec(int window) {
  json s = llama_spec();
  s["arch"] = "mistral";
  s["window"] = window;
  s["seed"] = 5;
  return s;
}

TEST(HfMistral, ImportMatchesReferenceWithAWindowShorterThanTheRows) {
  TempDir tmp("nk_hf_mistral");
  std::string hf = write_hf(tmp, "mistral", mistral_spec(5));
  HfImportReport rep = import_hf(hf, tmp / "nk");
  EXPECT_EQ(rep.architecture, "MistralForCausalLM");
  EXPECT_EQ(rep.config.arch, "mistral");
  EXPECT_EQ(rep.config.sliding_window, 5);
  expect_matches_reference(tmp, "mistral", tmp / "nk", kTol);

  // Full attention on the same weights is far from the windowed reference.
  json cfg = read_json(tmp / "nk/config.json");
  EXPECT_EQ(cfg["sliding_window"], 5);
  cfg.erase("sliding_window");
  write_json(tmp / "nk/config.json", cfg);
  auto full = load_model(tmp / "nk", DType::F32);
  SafetensorsFile ref = SafetensorsFile::open(tmp / "mistral.ref.safetensors");
  double rel = max_rel_diff(logits_of(*full, ref.get("tokens")), ref.get("logits"));
  EXPECT_GT(rel, 100 * kTol) << "the window does not change the logits";
}

TEST(HfMistral, NullWindowIsFullAttention) {
  TempDir tmp("nk_hf_mistral");
  json spec = mistral_spec(0);
  spec["window"] = nullptr;  // Mistral v0.2 and later
  std::string hf = write_hf(tmp, "mistral_full", spec);
  HfImportReport rep = import_hf(hf, tmp / "nk");
  EXPECT_EQ(rep.config.sliding_window, 0);
  expect_matches_reference(tmp, "mistral_full", tmp / "nk", kTol);
  EXPECT_FALSE(read_json(tmp / "nk/config.json").contains("sliding_window"));
}

TEST(HfMistral, ExportReadByReference) {
  TempDir tmp("nk_hf_mistral");
  ModelConfig c = model_preset("mistral-tiny");
  c.vocab_size = 97;
  c.sliding_window = 4;
  c.init_std = 0.15;
  Transformer model(c, DType::F32, 3);
  save_model(tmp / "model", model);
  HfExportOptions opt;
  opt.dtype = DType::F32;
  export_hf(tmp / "model", tmp / "hf", opt);
  json cfg = read_json(tmp / "hf/config.json");
  EXPECT_EQ(cfg["architectures"][0], "MistralForCausalLM");
  EXPECT_EQ(cfg["model_type"], "mistral");
  EXPECT_EQ(cfg["sliding_window"], 4);
  write_nekton_results(model, tmp / "nekton.safetensors");
  expect_reference_agrees(tmp / "hf", tmp / "nekton.safetensors", "mistral", kTol);
  // And back: the window survives the round trip.
  EXPECT_EQ(import_hf(tmp / "hf", tmp / "back").config.sliding_window, 4);
}

// Generation with the KV cache (prefill in chunks, then token by token) gives
// the tokens of recomputing the whole sequence each step, with a window
// shorter than the prompt.
TEST(HfMistral, KvCacheGenerationEqualsRecomputeWithAWindowShorterThanThePrompt) {
  ModelConfig c = model_preset("mistral-tiny");
  c.vocab_size = 97;
  c.sliding_window = 6;
  c.init_std = 0.3;
  Transformer model(c, DType::F32, 11);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 20; ++i) prompt.push_back(int32_t((i * 29 + 3) % 97));
  const std::vector<int32_t> want = greedy(model, prompt, 12);
  Generator gen(model, nullptr, 2, /*prefill_chunk=*/7);
  GenerationRequest req;
  req.prompt = prompt;
  req.max_new_tokens = 12;
  req.sampling.temperature = 0;
  const int64_t id = gen.submit(req);
  while (!gen.finished(id)) gen.step();
  EXPECT_EQ(gen.result(id).tokens, want);
}

TEST(HfMistral, GgufExportRefusesAWindow) {
  TempDir tmp("nk_hf_mistral");
  ModelConfig c = model_preset("mistral-tiny");
  Transformer model(c, DType::F32, 1);
  save_model(tmp / "model", model);
  RunResult r =
      run_nekton("export gguf " + (tmp / "model") + " " + (tmp / "m.gguf") + " --tokenizer bytes");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "sliding-window attention (64 positions)")) << r.out;
  EXPECT_FALSE(fs::exists(tmp / "m.gguf"));
}

}  // namespace
}  // namespace nk
