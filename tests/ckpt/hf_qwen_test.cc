// Qwen3 (q/k norms, a head size apart from hidden / heads), Qwen2-MoE
// (experts with top-k not renormalised, a shared expert behind a sigmoid
// gate, q/k/v biases) and Qwen3-MoE (q/k norms and experts, top-k
// renormalised) through Hugging Face import/export, checked against the
// independent float64 reference (tests/ckpt/hf_reference.py, written from
// transformers' equations): logits within 1e-5 relative in fp32, the
// training loss with the MoE losses and every weight's gradient against the
// reference's autograd, export giving back every source tensor byte for
// byte, generation through the KV cache equal to recomputing the whole
// sequence; dense layers among the MoE ones (mlp_only_layers,
// decoder_sparse_step) and the refusals.
#include <gtest/gtest.h>

#include "hf_test_util.h"
#include "infer/generate.h"
#include "model/arch.h"

namespace nk {
namespace {

using namespace nk::test;
using nlohmann::json;

constexpr double kTol = 1e-5;

struct QwenCase {
  const char* arch;
  const char* hf_class;
  const char* preset;
};

json spec_of(const std::string& arch) {
  json s = llama_spec();
  s["arch"] = arch;
  s["seed"] = 13;
  if (arch == "qwen3" || arch == "qwen3_moe") s["head_dim"] = 16;  // 4 x 16 != hidden 32
  if (arch == "qwen2_moe" || arch == "qwen3_moe") {
    s["experts"] = 4;
    s["top_k"] = 2;
    s["moe_ffn"] = 24;
  }
  if (arch == "qwen2_moe") s["shared_ffn"] = 40;
  if (arch == "qwen3_moe") s["norm_topk"] = true;
  return s;
}

class HfQwen : public ::testing::TestWithParam<QwenCase> {};

TEST_P(HfQwen, ImportMatchesReference) {
  const QwenCase& q = GetParam();
  TempDir tmp("nk_hf_qwen");
  std::string hf = write_hf(tmp, q.arch, spec_of(q.arch));
  HfImportReport rep = import_hf(hf, tmp / "nk");
  EXPECT_EQ(rep.architecture, q.hf_class);
  EXPECT_EQ(rep.config.arch, q.arch);
  const std::string arch = q.arch;
  if (arch != "qwen2_moe") {
    EXPECT_EQ(rep.config.head_dim(), 16);
  }
  if (arch != "qwen3") {
    EXPECT_EQ(rep.config.num_experts, 4);
    EXPECT_EQ(rep.config.expert_d_ff(), 24);
    EXPECT_EQ(rep.config.norm_topk_prob, arch == "qwen3_moe");
    EXPECT_DOUBLE_EQ(rep.config.moe_aux_loss_coeff, 0.001);
  }
  EXPECT_EQ(rep.config.moe_shared_d_ff, arch == "qwen2_moe" ? 40 : 0);
  EXPECT_EQ(rep.config.moe_shared_expert_gate, arch == "qwen2_moe");
  expect_matches_reference(tmp, q.arch, tmp / "nk", kTol);
}

TEST_P(HfQwen, ExportReproducesEverySourceTensor) {
  const QwenCase& q = GetParam();
  TempDir tmp("nk_hf_qwen");
  for (const char* dtype : {"F32", "BF16"}) {
    SCOPED_TRACE(dtype);
    json spec = spec_of(q.arch);
    spec["dtype"] = dtype;
    const std::string name = std::string(q.arch) + "_" + dtype;
    std::string hf = write_hf(tmp, name, spec);
    ASSERT_EQ(run_nekton("import hf " + hf + " " + (tmp / (name + "_nk"))).code, 0);
    RunResult r =
        run_nekton("export hf " + (tmp / (name + "_nk")) + " " + (tmp / (name + "_back")));
    ASSERT_EQ(r.code, 0) << r.out;
    auto src = hf_tensors(hf), out = hf_tensors(tmp / (name + "_back"));
    ASSERT_EQ(out.size(), src.size());
    for (auto& [t, raw] : src) EXPECT_TRUE(out[t] == raw) << t;
    json in = read_json(hf + "/config.json"), back = read_json(tmp / (name + "_back/config.json"));
    EXPECT_EQ(back["architectures"][0], q.hf_class);
    EXPECT_EQ(back["model_type"], q.arch);
    // Every key the source has that shapes the model comes back equal.
    for (const char* key : {"hidden_size",
                            "intermediate_size",
                            "num_hidden_layers",
                            "num_attention_heads",
                            "num_key_value_heads",
                            "head_dim",
                            "vocab_size",
                            "rms_norm_eps",
                            "rope_theta",
                            "tie_word_embeddings",
                            "num_experts",
                            "num_experts_per_tok",
                            "moe_intermediate_size",
                            "shared_expert_intermediate_size",
                            "norm_topk_prob",
                            "router_aux_loss_coef",
                            "decoder_sparse_step",
                            "mlp_only_layers",
                            "attention_bias",
                            "use_sliding_window"})
      if (in.contains(key)) {
        EXPECT_EQ(back[key], in[key]) << key;
      }
    // The reference reads the export.
    auto model = load_model(tmp / (name + "_nk"), DType::F32);
    write_nekton_results(*model, tmp / (name + ".nekton.safetensors"));
    expect_reference_agrees(tmp / (name + "_back"), tmp / (name + ".nekton.safetensors"), name,
                            kTol);
  }
}

// The training loss (cross-entropy + coeff x load-balancing + coeff x
// z-loss for the MoE ones) and every weight's gradient (q/k norms, router,
// shared expert and its gate included) against the reference's autograd.
TEST_P(HfQwen, LossAndGradientsMatchReferenceAutograd) {
  const QwenCase& q = GetParam();
  const bool moe = std::string(q.arch) != "qwen3";
  TempDir tmp("nk_hf_qwen");
  std::string hf = write_hf(tmp, q.arch, spec_of(q.arch));
  import_hf(hf, tmp / "nk");
  const double aux = moe ? 0.5 : 0, z = moe ? 0.25 : 0;  // large, so that their gradients show
  json cfg = read_json(tmp / "nk/config.json");
  if (moe) {
    cfg["moe"]["aux_loss_coeff"] = aux;
    cfg["moe"]["z_loss_coeff"] = z;
  }
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
  std::cout << "[ " << q.arch << " ] loss " << loss << " (reference " << want_loss[0] << ")\n";
  EXPECT_NEAR(loss, want_loss[0], 1e-5 * std::abs(want_loss[0]));
  if (moe) {
    const Transformer::MoeLosses ml = model->moe_losses(a);
    EXPECT_NEAR(ml.aux, want_loss[2], 1e-5 * want_loss[2]);
    EXPECT_NEAR(ml.z, want_loss[3], 1e-5 * want_loss[3]);
  }
  double worst = 0;
  int64_t n = 0, unused = 0;
  auto max_abs = [](const Tensor& t) {
    double m = 0;
    for (float v : floats(t)) m = std::max(m, double(std::abs(v)));
    return m;
  };
  for (const ExternalTensor& e : c.architecture().hf_tensors(c, "")) {
    const ParamInfo& p = model->layout().find(e.param);
    Tensor g = e.part.empty() ? ParamLayout::view(model->grads(), p)
                              : ParamLayout::part_view(model->grads(), p, e.part);
    const Tensor want = ref.get(e.name);
    ++n;
    if (max_abs(want) == 0) {  // an expert no token chose: no gradient either side
      EXPECT_EQ(max_abs(g), 0.0) << e.name;
      ++unused;
      continue;
    }
    const double rel = max_rel_diff(g, want);
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 1e-4) << e.name;
  }
  std::cout << "[ " << q.arch << " ] gradients of " << n << " tensors (" << unused
            << " of experts no token chose: zero both sides): worst "
            << "max relative difference " << worst << "\n";
  EXPECT_LT(unused, n / 4);
}

// Generation with the KV cache (prefill in chunks, then token by token) gives
// the tokens of recomputing the whole sequence each step.
TEST_P(HfQwen, KvCacheGenerationEqualsRecompute) {
  const QwenCase& q = GetParam();
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    ModelConfig c = model_preset(q.preset);
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

INSTANTIATE_TEST_SUITE_P(
    Archs, HfQwen,
    ::testing::Values(QwenCase{"qwen3", "Qwen3ForCausalLM", "qwen3-tiny"},
                      QwenCase{"qwen2_moe", "Qwen2MoeForCausalLM", "qwen2-moe-tiny"},
                      QwenCase{"qwen3_moe", "Qwen3MoeForCausalLM", "qwen3-moe-tiny"}),
    [](const auto& info) { return std::string(info.param.arch); });

// Dense layers among the MoE ones: HF makes layer l a dense MLP of
// intermediate_size when l is in mlp_only_layers or (l + 1) is not a
// multiple of decoder_sparse_step. Qwen2-MoE with decoder_sparse_step 2
// (layers 0 and 2 dense) and Qwen3-MoE with mlp_only_layers [1, 2]: the
// import lists them in model.moe_dense_layers, its logits equal the
// reference's within 1e-5 relative, the export gives back every source
// tensor byte for byte and a config.json that says the same layers
// (decoder_sparse_step 1, mlp_only_layers listing them all), which the
// reference reads to the same logits; cached generation equals the full
// forward.
TEST(HfQwenMoe, DenseLayersAmongMoeOnes) {
  TempDir tmp("nk_hf_qwen_dense");
  struct Case {
    const char* arch;
    json step, only;
    std::vector<int64_t> dense;
  };
  for (const Case& k : {Case{"qwen2_moe", 2, json::array(), {0, 2}},
                        Case{"qwen3_moe", 1, json::array({1, 2}), {1, 2}}}) {
    SCOPED_TRACE(k.arch);
    json spec = spec_of(k.arch);
    spec["layers"] = 4;
    spec["sparse_step"] = k.step;
    spec["mlp_only"] = k.only;
    const std::string name = k.arch;
    const std::string hf = write_hf(tmp, name, spec);
    HfImportReport rep = import_hf(hf, tmp / (name + "_nk"));
    EXPECT_EQ(rep.config.moe_dense_layers, k.dense);
    EXPECT_EQ(rep.config.n_moe_layers(), 2);
    expect_matches_reference(tmp, name, tmp / (name + "_nk"), kTol);

    RunResult r =
        run_nekton("export hf " + (tmp / (name + "_nk")) + " " + (tmp / (name + "_back")));
    ASSERT_EQ(r.code, 0) << r.out;
    auto src = hf_tensors(hf), out = hf_tensors(tmp / (name + "_back"));
    ASSERT_EQ(out.size(), src.size());
    for (auto& [t, raw] : src) EXPECT_TRUE(out[t] == raw) << t;
    json back = read_json(tmp / (name + "_back/config.json"));
    EXPECT_EQ(back["decoder_sparse_step"], 1);
    EXPECT_EQ(back["mlp_only_layers"], json(k.dense));
    EXPECT_EQ(back["intermediate_size"], spec["ffn"]);
    auto model = load_model(tmp / (name + "_nk"), DType::F32);
    write_nekton_results(*model, tmp / (name + ".nekton.safetensors"));
    expect_reference_agrees(tmp / (name + "_back"), tmp / (name + ".nekton.safetensors"), name,
                            kTol);

    // Prefill in chunks and decode through the KV cache: the dense and the
    // MoE layers' caches side by side.
    std::vector<int32_t> prompt;
    for (int i = 0; i < 20; ++i) prompt.push_back(int32_t((i * 29 + 3) % 97));
    const std::vector<int32_t> want = greedy(*model, prompt, 12);
    Generator gen(*model, nullptr, 2, /*prefill_chunk=*/7);
    GenerationRequest req;
    req.prompt = prompt;
    req.max_new_tokens = 12;
    req.sampling.temperature = 0;
    const int64_t id = gen.submit(req);
    while (!gen.finished(id)) gen.step();
    EXPECT_EQ(gen.result(id).tokens, want);
  }
}

// What cannot be built is refused at import naming the key: sliding
// windows, a decoder_sparse_step below 1, a layer outside the model, every
// layer dense.
TEST(HfQwenMoe, BadLayerSettingsAreRefusedNamingTheKey) {
  TempDir tmp("nk_hf_qwen");
  std::string hf = write_hf(tmp, "q", spec_of("qwen2_moe"));
  const json cfg = read_json(hf + "/config.json");
  for (auto [key, value, says] :
       {std::tuple<const char*, json, const char*>{"decoder_sparse_step", 0, "positive"},
        {"mlp_only_layers", json::array({5}), "layer 5"},
        {"mlp_only_layers", json::array({0, 1}), "every layer is dense"},
        {"use_sliding_window", true, "sliding"}}) {
    json bad = cfg;
    bad[key] = value;
    write_json(hf + "/config.json", bad);
    const std::string err = error_of([&] { import_hf(hf, tmp / "nk_bad"); });
    EXPECT_TRUE(contains(err, says)) << err;
    EXPECT_TRUE(contains(err, key) || contains(err, "decoder_sparse_step")) << err;
  }
}

}  // namespace
}  // namespace nk
