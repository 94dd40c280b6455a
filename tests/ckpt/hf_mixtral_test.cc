// Mixtral (Mistral's block with a sparse Mixture-of-Experts MLP) through
// Hugging Face import/export, checked against the independent float64
// reference (tests/ckpt/hf_reference.py computes the MoE block densely from
// transformers' equations: softmax router, top-k renormalised, every expert
// on every token weighted by its renormalised score or 0). Logits within
// 1e-5 relative in fp32 (as for Qwen2 and Mistral); the training loss with
// the load-balancing and z-losses and every weight's gradient (router
// included) against the reference's autograd; export gives back every
// source tensor byte for byte.
#include <gtest/gtest.h>

#include "hf_test_util.h"
#include "infer/generate.h"
#include "model/arch.h"

namespace nk {
namespace {

using namespace nk::test;
using nlohmann::json;

constexpr double kTol = 1e-5;

json mixtral_spec() {
  json s = llama_spec();
  s["arch"] = "mixtral";
  s["ffn"] = 24;
  s["experts"] = 4;
  s["top_k"] = 2;
  s["window"] = nullptr;
  s["seed"] = 7;
  return s;
}

TEST(HfMixtral, ImportMatchesReference) {
  TempDir tmp("nk_hf_mixtral");
  std::string hf = write_hf(tmp, "mixtral", mixtral_spec());
  HfImportReport rep = import_hf(hf, tmp / "nk");
  EXPECT_EQ(rep.architecture, "MixtralForCausalLM");
  EXPECT_EQ(rep.config.arch, "mixtral");
  EXPECT_EQ(rep.config.num_experts, 4);
  EXPECT_EQ(rep.config.num_experts_per_tok, 2);
  EXPECT_EQ(rep.config.expert_d_ff(), 24);
  EXPECT_DOUBLE_EQ(rep.config.moe_aux_loss_coeff, 0.02);
  expect_matches_reference(tmp, "mixtral", tmp / "nk", kTol);

  // Routing each token to one expert instead of two moves the logits far
  // outside the tolerance: the check sees the routing.
  json cfg = read_json(tmp / "nk/config.json");
  cfg["moe"]["num_experts_per_tok"] = 1;
  write_json(tmp / "nk/config.json", cfg);
  auto top1 = load_model(tmp / "nk", DType::F32);
  SafetensorsFile ref = SafetensorsFile::open(tmp / "mixtral.ref.safetensors");
  EXPECT_GT(max_rel_diff(logits_of(*top1, ref.get("tokens")), ref.get("logits")), 100 * kTol);
}

TEST(HfMixtral, ExportReproducesEverySourceTensor) {
  TempDir tmp("nk_hf_mixtral");
  for (const char* dtype : {"F32", "BF16"}) {
    SCOPED_TRACE(dtype);
    json spec = mixtral_spec();
    spec["dtype"] = dtype;
    const std::string name = std::string("mixtral_") + dtype;
    std::string hf = write_hf(tmp, name, spec);
    ASSERT_EQ(run_nekton("import hf " + hf + " " + (tmp / (name + "_nk"))).code, 0);
    RunResult r =
        run_nekton("export hf " + (tmp / (name + "_nk")) + " " + (tmp / (name + "_back")));
    ASSERT_EQ(r.code, 0) << r.out;
    auto src = hf_tensors(hf), out = hf_tensors(tmp / (name + "_back"));
    ASSERT_EQ(out.size(), src.size());
    for (auto& [t, raw] : src) EXPECT_TRUE(out[t] == raw) << t;
    json back = read_json(tmp / (name + "_back/config.json"));
    EXPECT_EQ(back["architectures"][0], "MixtralForCausalLM");
    EXPECT_EQ(back["model_type"], "mixtral");
    EXPECT_EQ(back["num_local_experts"], 4);
    EXPECT_EQ(back["num_experts_per_tok"], 2);
    EXPECT_EQ(back["intermediate_size"], 24);
    EXPECT_EQ(back["router_aux_loss_coef"], 0.02);
    // The reference reads the export.
    auto model = load_model(tmp / (name + "_nk"), DType::F32);
    write_nekton_results(*model, tmp / (name + ".nekton.safetensors"));
    expect_reference_agrees(tmp / (name + "_back"), tmp / (name + ".nekton.safetensors"), name,
                            kTol);
  }
}

// The training loss (cross-entropy + coeff x load-balancing + coeff x
// z-loss) and every weight's gradient, against the reference's autograd.
TEST(HfMixtral, LossAndGradientsMatchReferenceAutograd) {
  TempDir tmp("nk_hf_mixtral");
  std::string hf = write_hf(tmp, "mixtral", mixtral_spec());
  import_hf(hf, tmp / "nk");
  const double aux = 0.5, z = 0.25;  // large, so that their gradients show
  json cfg = read_json(tmp / "nk/config.json");
  cfg["moe"]["aux_loss_coeff"] = aux;
  cfg["moe"]["z_loss_coeff"] = z;
  write_json(tmp / "nk/config.json", cfg);
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
                            (tmp / "grads.safetensors") + " " + fmt::format("{:g} {:g}", aux, z));
  ASSERT_EQ(r.code, 0) << r.out;
  SafetensorsFile ref = SafetensorsFile::open(tmp / "grads.safetensors");
  const std::vector<float> want_loss = floats(ref.get("loss"));  // total, ce, aux, z

  Activations a(*model, B, T, true);
  model->zero_grads();
  const float loss =
      model->forward_backward(a, i32_tensor({B, T}, tok), i32_tensor({B, T}, tgt), 1.f);
  const Transformer::MoeLosses ml = model->moe_losses(a);
  std::cout << "[ mixtral ] loss " << loss << " (reference " << want_loss[0] << "), aux " << ml.aux
            << " (" << want_loss[2] << "), z " << ml.z << " (" << want_loss[3] << ")\n";
  EXPECT_NEAR(loss, want_loss[0], 1e-5 * std::abs(want_loss[0]));
  EXPECT_NEAR(ml.aux, want_loss[2], 1e-5 * want_loss[2]);
  EXPECT_NEAR(ml.z, want_loss[3], 1e-5 * want_loss[3]);

  double worst = 0;
  for (const ExternalTensor& e : c.architecture().hf_tensors(c, "")) {
    const ParamInfo& p = model->layout().find(e.param);
    Tensor g = e.part.empty() ? ParamLayout::view(model->grads(), p)
                              : ParamLayout::part_view(model->grads(), p, e.part);
    const double rel = max_rel_diff(g, ref.get(e.name));
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 1e-4) << e.name;
  }
  std::cout << "[ mixtral ] gradients: worst max relative difference " << worst << "\n";

  // Without the MoE losses the router's gradient is another one: the
  // comparison above sees them.
  cfg["moe"]["aux_loss_coeff"] = 0;
  cfg["moe"]["z_loss_coeff"] = 0;
  write_json(tmp / "nk/config.json", cfg);
  auto plain = load_model(tmp / "nk", DType::F32);
  Activations a2(*plain, B, T, true);
  plain->zero_grads();
  plain->forward_backward(a2, i32_tensor({B, T}, tok), i32_tensor({B, T}, tgt), 1.f);
  const ParamInfo& router = plain->layout().find("h.0.moe.router.weight");
  EXPECT_GT(max_rel_diff(ParamLayout::view(plain->grads(), router),
                         ref.get("model.layers.0.block_sparse_moe.gate.weight")),
            1e-2);
}

// Generation with the KV cache (prefill in chunks, then token by token) gives
// the tokens of recomputing the whole sequence each step; each step's MoE
// block routes only the tokens it carries.
TEST(HfMixtral, KvCacheGenerationEqualsRecompute) {
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    ModelConfig c = model_preset("mixtral-tiny");
    c.vocab_size = 97;
    c.init_std = 0.3;
    Transformer model(c, dt, 11);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 20; ++i) prompt.push_back(int32_t((i * 29 + 3) % 97));
    std::vector<int32_t> want;
    if (dt == DType::F32) want = greedy(model, prompt, 12);
    Generator gen(model, nullptr, 2, /*prefill_chunk=*/7);
    GenerationRequest req;
    req.prompt = prompt;
    req.max_new_tokens = 12;
    req.sampling.temperature = 0;
    const int64_t id = gen.submit(req);
    while (!gen.finished(id)) gen.step();
    if (dt == DType::F32)
      EXPECT_EQ(gen.result(id).tokens, want);
    else
      EXPECT_EQ(gen.result(id).tokens.size(), 12u);
  }
}

// The same with DeepSeek-V3's routing (sigmoid, groups, a nonzero score
// bias, scaling) and a leading dense layer: decode takes each layer's kind.
TEST(HfMixtral, DeepSeekRoutingKvCacheGenerationEqualsRecompute) {
  ModelConfig c = model_preset("mixtral-tiny");
  c.n_layer = 3;
  c.vocab_size = 97;
  c.init_std = 0.3;
  c.num_experts = 8;
  c.moe_score_func = "sigmoid";
  c.moe_n_group = 4;
  c.moe_topk_group = 2;
  c.moe_routed_scaling = 2.5;
  c.moe_score_bias = true;
  c.moe_first_dense_layers = 1;
  Transformer model(c, DType::F32, 11);
  for (int64_t l = 1; l < c.n_layer; ++l) {
    const ParamInfo& p = model.layout().find(fmt::format("h.{}.moe.score_bias", l));
    Tensor b = Tensor::empty({c.num_experts}, DType::F32);
    for (int64_t e = 0; e < c.num_experts; ++e) b.data<float>()[e] = 0.05f * float((e * 5) % 7);
    model.set_param(p, b);
  }
  EXPECT_FALSE(model.layout().has("h.0.moe.router.weight"));
  EXPECT_TRUE(model.layout().has("h.0.mlp.up.weight"));
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

// llama.cpp's "llama" graph renormalises the top-k of softmax scores: a
// Mixtral-style model that does not is refused by GGUF export, naming the
// setting, and nothing is written. (The exported files themselves:
// gguf_import_test.cc and gguf_llama_cpp_test.cc.)
TEST(HfMixtral, GgufExportOfARouterLlamaCppRunsDifferentlyIsRefused) {
  TempDir tmp("nk_hf_mixtral");
  ModelConfig c = model_preset("mixtral-tiny");
  c.norm_topk_prob = false;
  Transformer model(c, DType::F32, 1);
  save_model(tmp / "model", model);
  RunResult r =
      run_nekton("export gguf " + (tmp / "model") + " " + (tmp / "m.gguf") + " --tokenizer bytes");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "norm_topk_prob = false")) << r.out;
  EXPECT_FALSE(fs::exists(tmp / "m.gguf"));
}

}  // namespace
}  // namespace nk
