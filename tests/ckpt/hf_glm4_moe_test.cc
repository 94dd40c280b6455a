// GLM-4.5 (Glm4MoeForCausalLM: q/k/v biases, optional q/k norms, partial
// rotary over half of each head, DeepSeek-V3's MoE with a shared expert)
// through Hugging Face import/export, checked against the independent
// float64 reference (tests/ckpt/glm4_moe_reference.py, written from
// transformers' modeling_glm4_moe.py): logits within 1e-5 relative and the
// same greedy continuation, with q/k norms and groups (GLM-4.5-like) and
// without, with a multi-token-prediction layer in the checkpoint
// (GLM-4.5-Air-like: left out); export gives back every source tensor byte
// for byte and no MTP layer; the preset generates through the KV cache as it
// recomputes; what cannot be built is refused naming the key.
#include <gtest/gtest.h>

#include "hf_test_util.h"
#include "infer/generate.h"
#include "model/arch.h"

namespace nk {
namespace {

using namespace nk::test;
using nlohmann::json;

constexpr double kTol = 1e-5;

// 3 layers (the first dense), heads of 16 over a width of 32 (4 x 16 = 64,
// as GLM-4.5's head size differs), 8 of each head's values rotated; 8
// experts in 4 groups, each token's 2 from its best 2 groups, scaled by
// 2.5, one shared expert; q/k norms (GLM-4.5's use_qk_norm).
json glm_spec() {
  json s = llama_spec();
  s["arch"] = "glm4_moe";
  s["seed"] = 23;
  s["layers"] = 3;
  s["head_dim"] = 16;
  s["experts"] = 8;
  s["top_k"] = 2;
  s["moe_ffn"] = 24;
  s["shared_experts"] = 1;
  s["groups"] = 4;
  s["topk_groups"] = 2;
  s["scaling"] = 2.5;
  s["first_dense"] = 1;
  s["qk_norm"] = true;
  s["partial_rotary"] = 0.5;
  return s;
}

// GLM-4.5-Air's shape in small: no q/k norms, one group, two shared
// experts' width, a multi-token-prediction layer after the model's layers.
json air_spec() {
  json s = glm_spec();
  s["seed"] = 29;
  s["qk_norm"] = false;
  s["groups"] = 1;
  s["topk_groups"] = 1;
  s["scaling"] = 1.0;
  s["shared_experts"] = 2;
  s["mtp"] = 1;
  return s;
}

TEST(HfGlm4Moe, ImportMatchesReference) {
  TempDir tmp("nk_hf_glm");
  std::string hf = write_hf(tmp, "glm", glm_spec());
  HfImportReport rep = import_hf(hf, tmp / "nk");
  EXPECT_EQ(rep.architecture, "Glm4MoeForCausalLM");
  const ModelConfig& c = rep.config;
  EXPECT_EQ(c.arch, "glm4_moe");
  EXPECT_EQ(c.head_dim(), 16);
  EXPECT_EQ(c.rotary_dim(), 8);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.block().qk_norm);
  EXPECT_TRUE(c.block().qkv_bias);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.expert_d_ff(), 24);
  EXPECT_EQ(c.moe_shared_d_ff, 24);
  EXPECT_EQ(c.moe_score_func, "sigmoid");
  EXPECT_TRUE(c.has_score_bias());
  EXPECT_EQ(c.moe_n_group, 4);
  EXPECT_EQ(c.moe_topk_group, 2);
  EXPECT_DOUBLE_EQ(c.moe_routed_scaling, 2.5);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.moe_first_dense_layers, 1);
  expect_matches_reference(tmp, "glm", tmp / "nk", kTol);
}

TEST(HfGlm4Moe, AirShapeWithAMultiTokenPredictionLayerImportsWithoutIt) {
  TempDir tmp("nk_hf_glm");
  std::string hf = write_hf(tmp, "air", air_spec());
  HfImportReport rep = import_hf(hf, tmp / "nk");
  const ModelConfig& c = rep.config;
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.block().qk_norm);
  EXPECT_EQ(c.n_layer, 3);  // the MTP layer (model.layers.3.*) left out
  EXPECT_EQ(c.moe_shared_d_ff, 48);
  expect_matches_reference(tmp, "air", tmp / "nk", kTol);
  // Export writes no MTP layer and says so.
  RunResult r = run_nekton("export hf " + (tmp / "nk") + " " + (tmp / "back"));
  ASSERT_EQ(r.code, 0) << r.out;
  json back = read_json(tmp / "back/config.json");
  EXPECT_EQ(back["num_nextn_predict_layers"], 0);
  EXPECT_EQ(back["use_qk_norm"], false);
  auto src = hf_tensors(hf), out = hf_tensors(tmp / "back");
  for (auto& [t, raw] : out) EXPECT_TRUE(src.count(t) && src[t] == raw) << t;
  for (auto& [t, raw] : src)
    EXPECT_EQ(out.count(t), t.starts_with("model.layers.3.") ? 0u : 1u) << t;
}

TEST(HfGlm4Moe, ExportReproducesEverySourceTensor) {
  TempDir tmp("nk_hf_glm");
  for (const char* dtype : {"F32", "BF16"}) {
    SCOPED_TRACE(dtype);
    json spec = glm_spec();
    spec["dtype"] = dtype;
    const std::string name = std::string("glm_") + dtype;
    std::string hf = write_hf(tmp, name, spec);
    ASSERT_EQ(run_nekton("import hf " + hf + " " + (tmp / (name + "_nk"))).code, 0);
    RunResult r =
        run_nekton("export hf " + (tmp / (name + "_nk")) + " " + (tmp / (name + "_back")));
    ASSERT_EQ(r.code, 0) << r.out;
    auto src = hf_tensors(hf), out = hf_tensors(tmp / (name + "_back"));
    ASSERT_EQ(out.size(), src.size());
    for (auto& [t, raw] : src) EXPECT_TRUE(out[t] == raw) << t;
    json in = read_json(hf + "/config.json"), back = read_json(tmp / (name + "_back/config.json"));
    EXPECT_EQ(back["architectures"][0], "Glm4MoeForCausalLM");
    EXPECT_EQ(back["model_type"], "glm4_moe");
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

// The preset (glm4_moe-tiny) generates through the KV cache (prefill in
// chunks, then token by token) as it recomputes the whole sequence.
TEST(HfGlm4Moe, KvCacheGenerationEqualsRecompute) {
  ModelConfig c = model_preset("glm4_moe-tiny");
  c.vocab_size = 97;
  c.init_std = 0.3;
  Transformer model(c, DType::F32, 13);
  // A nonzero score bias, so that it takes part in the choice.
  for (int64_t l = 1; l < c.n_layer; ++l) {
    const ParamInfo& p = model.layout().find(fmt::format("h.{}.moe.score_bias", l));
    std::vector<float> b(size_t(c.num_experts));
    for (size_t e = 0; e < b.size(); ++e) b[e] = 0.05f * float((int(e) * 5 + int(l)) % 5 - 2);
    model.set_param(p, Tensor::from_blob(b.data(), {c.num_experts}, DType::F32));
  }
  std::vector<int32_t> prompt;
  for (int i = 0; i < 20; ++i) prompt.push_back(int32_t((i * 31 + 7) % 97));
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

TEST(HfGlm4Moe, UnsupportedSettingsAreRefusedNamingTheKey) {
  TempDir tmp("nk_hf_glm");
  std::string hf = write_hf(tmp, "g", glm_spec());
  const json cfg = read_json(hf + "/config.json");
  for (auto [key, value] : {std::pair<const char*, json>{"attention_bias", false},
                            {"first_k_dense_replace", 3},
                            {"n_group", 3},
                            {"partial_rotary_factor", 1.5},
                            {"num_nextn_predict_layers", -1}}) {
    json bad = cfg;
    bad[key] = value;
    write_json(hf + "/config.json", bad);
    const std::string err = error_of([&] { import_hf(hf, tmp / "nk_bad"); });
    EXPECT_TRUE(contains(err, key)) << key << ": " << err;
  }
  // Only model.layers.L.* with L >= num_hidden_layers (an MTP layer) is
  // left out; any other stray tensor is refused.
  const Architecture& a = find_architecture("glm4_moe");
  const ModelConfig c = model_preset("glm4_moe-tiny");
  EXPECT_TRUE(a.hf_skipped_tensor(c, "model.layers.3.eh_proj.weight"));
  EXPECT_FALSE(a.hf_skipped_tensor(c, "model.layers.2.extra.weight"));
  EXPECT_FALSE(a.hf_skipped_tensor(c, "model.layersX.weight"));
  EXPECT_FALSE(a.hf_skipped_tensor(c, "lm_head.bias"));
  json stray = cfg;
  write_json(hf + "/config.json", stray);
  EXPECT_EQ(import_hf(hf, tmp / "nk_ok").config.n_layer, 3);
}

}  // namespace
}  // namespace nk
