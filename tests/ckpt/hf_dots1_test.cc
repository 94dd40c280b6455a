// dots.llm1 (Dots1ForCausalLM: Qwen3's attention with DeepSeek-V3's
// fine-grained MoE) through Hugging Face import/export, checked against the
// independent float64 reference (tests/ckpt/hf_reference.py's dots1_moe,
// written from transformers' published equations): sigmoid scores, the
// top-k from the best groups of the scores plus e_score_correction_bias,
// the unbiased scores renormalised and scaled by routed_scaling_factor, an
// ungated shared expert, a leading dense layer. Logits within 1e-5
// relative; export gives back every source tensor byte for byte; cached
// generation equals the full forward; what cannot be built is refused
// naming the key.
#include <gtest/gtest.h>

#include "hf_test_util.h"
#include "infer/generate.h"
#include "model/arch.h"

namespace nk {
namespace {

using namespace nk::test;
using nlohmann::json;

constexpr double kTol = 1e-5;

// 3 layers (the first dense), 8 experts in 4 groups, each token's 2 from its
// best 2 groups, scaled by 2.5, two shared experts' width; heads of 16 over
// a width of 32 (4 x 16 = 64, as Qwen3's head size differs).
json dots1_spec() {
  json s = llama_spec();
  s["arch"] = "dots1";
  s["seed"] = 17;
  s["layers"] = 3;
  s["head_dim"] = 16;
  s["experts"] = 8;
  s["top_k"] = 2;
  s["moe_ffn"] = 24;
  s["shared_experts"] = 2;
  s["groups"] = 4;
  s["topk_groups"] = 2;
  s["scaling"] = 2.5;
  s["first_dense"] = 1;
  return s;
}

TEST(HfDots1, ImportMatchesReference) {
  TempDir tmp("nk_hf_dots1");
  std::string hf = write_hf(tmp, "dots1", dots1_spec());
  HfImportReport rep = import_hf(hf, tmp / "nk");
  EXPECT_EQ(rep.architecture, "Dots1ForCausalLM");
  const ModelConfig& c = rep.config;
  EXPECT_EQ(c.arch, "dots1");
  EXPECT_EQ(c.head_dim(), 16);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.expert_d_ff(), 24);
  EXPECT_EQ(c.moe_shared_d_ff, 48);
  EXPECT_FALSE(c.moe_shared_expert_gate);
  EXPECT_EQ(c.moe_score_func, "sigmoid");
  EXPECT_TRUE(c.has_score_bias());
  EXPECT_EQ(c.moe_n_group, 4);
  EXPECT_EQ(c.moe_topk_group, 2);
  EXPECT_DOUBLE_EQ(c.moe_routed_scaling, 2.5);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.moe_first_dense_layers, 1);
  EXPECT_FALSE(c.moe_layer(0));
  EXPECT_TRUE(c.moe_layer(2));
  expect_matches_reference(tmp, "dots1", tmp / "nk", kTol);
}

TEST(HfDots1, ExportReproducesEverySourceTensor) {
  TempDir tmp("nk_hf_dots1");
  for (const char* dtype : {"F32", "BF16"}) {
    SCOPED_TRACE(dtype);
    json spec = dots1_spec();
    spec["dtype"] = dtype;
    const std::string name = std::string("dots1_") + dtype;
    std::string hf = write_hf(tmp, name, spec);
    ASSERT_EQ(run_nekton("import hf " + hf + " " + (tmp / (name + "_nk"))).code, 0);
    RunResult r =
        run_nekton("export hf " + (tmp / (name + "_nk")) + " " + (tmp / (name + "_back")));
    ASSERT_EQ(r.code, 0) << r.out;
    auto src = hf_tensors(hf), out = hf_tensors(tmp / (name + "_back"));
    ASSERT_EQ(out.size(), src.size());
    for (auto& [t, raw] : src) EXPECT_TRUE(out[t] == raw) << t;
    json in = read_json(hf + "/config.json"), back = read_json(tmp / (name + "_back/config.json"));
    EXPECT_EQ(back["architectures"][0], "Dots1ForCausalLM");
    EXPECT_EQ(back["model_type"], "dots1");
    for (auto& [key, value] : in.items()) {
      if (key == "torch_dtype" || key == "bos_token_id" || key == "eos_token_id" ||
          key == "rope_scaling" || key == "rope_theta")
        continue;
      EXPECT_EQ(back[key], value) << key;
    }
    auto model = load_model(tmp / (name + "_nk"), DType::F32);
    write_nekton_results(*model, tmp / (name + ".nekton.safetensors"));
    expect_reference_agrees(tmp / (name + "_back"), tmp / (name + ".nekton.safetensors"), name,
                            kTol);
  }
}

// The preset (dots1-tiny) generates through the KV cache as it recomputes.
TEST(HfDots1, KvCacheGenerationEqualsRecompute) {
  ModelConfig c = model_preset("dots1-tiny");
  c.vocab_size = 97;
  c.init_std = 0.3;
  Transformer model(c, DType::F32, 11);
  // A nonzero score bias, so that it takes part in the choice.
  for (int64_t l = 1; l < c.n_layer; ++l) {
    const ParamInfo& p = model.layout().find(fmt::format("h.{}.moe.score_bias", l));
    std::vector<float> b(size_t(c.num_experts));
    for (size_t e = 0; e < b.size(); ++e) b[e] = 0.05f * float((int(e) * 7 + int(l)) % 5 - 2);
    model.set_param(p, Tensor::from_blob(b.data(), {c.num_experts}, DType::F32));
  }
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

TEST(HfDots1, UnsupportedSettingsAreRefusedNamingTheKey) {
  TempDir tmp("nk_hf_dots1");
  std::string hf = write_hf(tmp, "d", dots1_spec());
  const json cfg = read_json(hf + "/config.json");
  for (auto [key, value] :
       {std::pair<const char*, json>{"attention_bias", true},
        {"layer_types", json::array({"full_attention", "sliding_attention", "full_attention"})},
        {"first_k_dense_replace", 3},
        {"n_group", 3}}) {
    json bad = cfg;
    bad[key] = value;
    write_json(hf + "/config.json", bad);
    const std::string err = error_of([&] { import_hf(hf, tmp / "nk_bad"); });
    EXPECT_TRUE(contains(err, std::string("'") + key + "'")) << err;
  }
  json slides = cfg;
  slides["sliding_window"] = 8;
  slides["max_window_layers"] = 1;
  write_json(hf + "/config.json", slides);
  const std::string err = error_of([&] { import_hf(hf, tmp / "nk_bad"); });
  EXPECT_TRUE(contains(err, "'max_window_layers'")) << err;
}

}  // namespace
}  // namespace nk
