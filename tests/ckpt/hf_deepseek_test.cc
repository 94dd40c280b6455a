// DeepSeek-V2 and DeepSeek-V3 (Multi-head Latent Attention with
// DeepSeekMoE) through Hugging Face import/export, checked against the
// independent float64 reference (tests/ckpt/deepseek_reference.py, written
// from the published modelling equations): a V2-Lite-like model (one query
// projection, softmax greedy routing, routed_scaling_factor) and a V3-like
// one (the q_lora bottleneck, sigmoid group-limited routing with
// e_score_correction_bias, yarn RoPE with mscale / mscale_all_dim, which
// scale both cos/sin and the scores). Logits within 1e-5 relative; export
// gives back every source tensor byte for byte; the loss and every
// gradient equal the reference's autograd; cached generation equals the
// full forward; what cannot be built is refused naming the key.
#include <gtest/gtest.h>

#include <algorithm>

#include "hf_test_util.h"
#include "infer/generate.h"
#include "model/arch.h"

namespace nk {
namespace {

using namespace nk::test;
using nlohmann::json;

constexpr double kDsTol = 1e-5;

json ds_base_spec(const char* arch) {
  json s = llama_spec();
  s["arch"] = arch;
  s["layers"] = 3;
  s["hidden"] = 32;
  s["heads"] = 4;
  s["ffn"] = 48;
  s["nope"] = 12;
  s["rope"] = 8;
  s["v_dim"] = 10;
  s["kv_rank"] = 20;
  s["experts"] = 8;
  s["top_k"] = 2;
  s["moe_ffn"] = 16;
  s["shared_experts"] = 2;
  s["first_dense"] = 1;
  s["eps"] = 1e-6;
  return s;
}

// V2-Lite's shape: no q_lora_rank, greedy softmax routing, unnormalised
// weights scaled.
json ds_v2_spec() {
  json s = ds_base_spec("deepseek_v2");
  s["seed"] = 23;
  s["scaling"] = 1.5;
  s["norm_topk"] = false;
  return s;
}

// V3's: the q bottleneck, 4 groups (each token's 2 from its best 2),
// renormalised and scaled by 2.5, yarn with mscale != mscale_all_dim.
json ds_v3_spec() {
  json s = ds_base_spec("deepseek_v3");
  s["seed"] = 29;
  s["q_rank"] = 24;
  s["groups"] = 4;
  s["topk_groups"] = 2;
  s["scaling"] = 2.5;
  s["norm_topk"] = true;
  s["rope_scaling"] = {
      {"type", "yarn"},       {"factor", 4.0},  {"original_max_position_embeddings", 8},
      {"beta_fast", 32},      {"beta_slow", 1}, {"mscale", 1.0},
      {"mscale_all_dim", 0.8}};
  return s;
}

struct DsCase {
  const char* name;
  json (*spec)();
  const char* cls;
};
const DsCase kDsCases[] = {{"v2", ds_v2_spec, "DeepseekV2ForCausalLM"},
                           {"v3", ds_v3_spec, "DeepseekV3ForCausalLM"}};

class HfDeepseek : public ::testing::TestWithParam<DsCase> {};

TEST_P(HfDeepseek, ImportMatchesReference) {
  const DsCase& k = GetParam();
  TempDir tmp("nk_hf_deepseek");
  std::string hf = write_hf(tmp, k.name, k.spec());
  HfImportReport rep = import_hf(hf, tmp / "nk");
  EXPECT_EQ(rep.architecture, k.cls);
  const ModelConfig& c = rep.config;
  EXPECT_TRUE(c.mla());
  EXPECT_EQ(c.head_dim(), 20);
  EXPECT_EQ(c.qk_rope_head_dim, 8);
  EXPECT_EQ(c.v_head_dim, 10);
  EXPECT_EQ(c.kv_lora_rank, 20);
  EXPECT_EQ(c.q_lora_rank, std::string(k.name) == "v3" ? 24 : 0);
  EXPECT_EQ(c.n_kv_head, c.n_head);
  EXPECT_EQ(c.moe_shared_d_ff, 32);
  EXPECT_EQ(c.moe_first_dense_layers, 1);
  expect_matches_reference(tmp, k.name, tmp / "nk", kDsTol);
}

TEST_P(HfDeepseek, ExportReproducesEverySourceTensor) {
  const DsCase& k = GetParam();
  TempDir tmp("nk_hf_deepseek");
  for (const char* dtype : {"F32", "BF16"}) {
    SCOPED_TRACE(dtype);
    json spec = k.spec();
    spec["dtype"] = dtype;
    const std::string name = std::string(k.name) + "_" + dtype;
    std::string hf = write_hf(tmp, name, spec);
    ASSERT_EQ(run_nekton("import hf " + hf + " " + (tmp / (name + "_nk"))).code, 0);
    RunResult r =
        run_nekton("export hf " + (tmp / (name + "_nk")) + " " + (tmp / (name + "_back")));
    ASSERT_EQ(r.code, 0) << r.out;
    auto src = hf_tensors(hf), out = hf_tensors(tmp / (name + "_back"));
    ASSERT_EQ(out.size(), src.size());
    for (auto& [t, raw] : src) EXPECT_TRUE(out[t] == raw) << t;
    json in = read_json(hf + "/config.json"), back = read_json(tmp / (name + "_back/config.json"));
    EXPECT_EQ(back["architectures"][0], k.cls);
    for (auto& [key, value] : in.items()) {
      if (key == "torch_dtype" || key == "bos_token_id" || key == "eos_token_id" ||
          key == "rope_scaling" || key == "aux_loss_alpha" || key == "seq_aux")
        continue;
      EXPECT_EQ(back[key], value) << key;
    }
    auto model = load_model(tmp / (name + "_nk"), DType::F32);
    write_nekton_results(*model, tmp / (name + ".nekton.safetensors"));
    expect_reference_agrees(tmp / (name + "_back"), tmp / (name + ".nekton.safetensors"), name,
                            std::string(dtype) == "F32" ? kDsTol : kHfTol);
  }
}

// The training loss and every weight's gradient (MLA's projections and
// latent norms, the routers, experts, shared experts) against the
// reference's autograd.
TEST_P(HfDeepseek, LossAndGradientsMatchReferenceAutograd) {
  const DsCase& k = GetParam();
  TempDir tmp("nk_hf_deepseek");
  std::string hf = write_hf(tmp, k.name, k.spec());
  import_hf(hf, tmp / "nk");
  auto model = load_model(tmp / "nk", DType::F32);
  const ModelConfig& c = model->config();
  const int64_t B = 2, T = 12, V = c.vocab_size;
  std::vector<int32_t> tok(size_t(B * T)), tgt(tok.size());
  for (size_t i = 0; i < tok.size(); ++i) {
    tok[i] = int32_t((i * 41 + 3) % size_t(V));
    tgt[i] = int32_t((i * 23 + 17) % size_t(V));
  }
  save_safetensors(tmp / "batch.safetensors",
                   {{"tokens", i32_tensor({B, T}, tok)}, {"targets", i32_tensor({B, T}, tgt)}});
  RunResult r = run_command(kReference + " grads " + hf + " " + (tmp / "batch.safetensors") + " " +
                            (tmp / "grads.safetensors") + " 0 0");
  ASSERT_EQ(r.code, 0) << r.out;
  SafetensorsFile ref = SafetensorsFile::open(tmp / "grads.safetensors");
  const std::vector<float> want_loss = floats(ref.get("loss"));
  Activations a(*model, B, T, true);
  model->zero_grads();
  const float loss =
      model->forward_backward(a, i32_tensor({B, T}, tok), i32_tensor({B, T}, tgt), 1.f);
  EXPECT_NEAR(loss, want_loss[0], 1e-5 * std::abs(want_loss[0]));
  double worst = 0;
  for (const ExternalTensor& e : c.architecture().hf_tensors(c, "")) {
    if (e.param.ends_with("score_bias")) continue;  // frozen: moved by balancing, not gradients
    const ParamInfo& p = model->layout().find(e.param);
    Tensor gr = e.part.empty() ? ParamLayout::view(model->grads(), p)
                               : ParamLayout::part_view(model->grads(), p, e.part);
    // An expert no token was routed to has a zero gradient on both sides.
    const Tensor want = ref.get(e.name);
    const std::vector<float> w = floats(want), o = floats(gr);
    const bool zero = std::all_of(w.begin(), w.end(), [](float x) { return x == 0.f; });
    double rel = zero ? 0.0 : max_rel_diff(gr, want);
    for (float x : o)
      if (zero) rel = std::max(rel, double(std::abs(x)));
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 1e-4) << e.name;
  }
  std::cout << "[ " << k.name << " ] loss " << loss << " (reference " << want_loss[0]
            << "), worst gradient max relative difference " << worst << "\n";
}

INSTANTIATE_TEST_SUITE_P(Archs, HfDeepseek, ::testing::ValuesIn(kDsCases),
                         [](const auto& info) { return std::string(info.param.name); });

// The presets generate through the KV cache (prefill in chunks, then one
// token at a time) as they recompute, in f32 and bf16.
TEST(HfDeepseekGenerate, KvCacheGenerationEqualsRecompute) {
  for (const char* preset : {"deepseek_v2-tiny", "deepseek_v3-tiny"}) {
    SCOPED_TRACE(preset);
    ModelConfig c = model_preset(preset);
    c.vocab_size = 97;
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
}

TEST(HfDeepseekRefusals, UnsupportedSettingsAreRefusedNamingTheKey) {
  TempDir tmp("nk_hf_deepseek");
  for (const DsCase& k : kDsCases) {
    std::string hf = write_hf(tmp, k.name, k.spec());
    const json cfg = read_json(hf + "/config.json");
    std::vector<std::pair<const char*, json>> bad_keys = {{"attention_bias", true},
                                                          {"first_k_dense_replace", 3},
                                                          {"moe_layer_freq", 2},
                                                          {"rope_interleave", false},
                                                          {"topk_method", "group_limited_greedy"}};
    if (std::string(k.name) == "v3") bad_keys.push_back({"n_group", 3});
    for (auto [key, value] : bad_keys) {
      json bad = cfg;
      bad[key] = value;
      write_json(hf + "/config.json", bad);
      const std::string err = error_of([&] { import_hf(hf, tmp / "nk_bad"); });
      EXPECT_TRUE(contains(err, std::string("'") + key + "'")) << k.name << ": " << err;
    }
  }
}

// Tensor parallelism splits the heads (tests/parallel/tensor_parallel:
// DeepSeek under TP2 equals one process): a tp size that does not divide
// them is refused naming the key.
TEST(HfDeepseekRefusals, TensorParallelNeedsWholeHeads) {
  ModelConfig c = model_preset("deepseek_v3-tiny");
  EXPECT_NO_THROW(check_tensor_parallel(c, 2, false));
  EXPECT_NO_THROW(check_tensor_parallel(c, 4, false));
  const std::string err = error_of([&] { check_tensor_parallel(c, 3, false); });
  EXPECT_TRUE(contains(err, "model.n_head = 4 is not divisible by parallel.tp = 3")) << err;
}

}  // namespace
}  // namespace nk
