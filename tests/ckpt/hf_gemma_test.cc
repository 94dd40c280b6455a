// Gemma 2 (Gemma2ForCausalLM) and Gemma 3's text model (Gemma3ForCausalLM)
// through Hugging Face import/export, against the independent float64
// reference (tests/ckpt/gemma_reference.py, from transformers' modelling
// equations): logits within 1e-5 relative in fp32 at sequence lengths past
// the sliding window (GeGLU, (1 + w) norms before and after both
// sub-blocks, scaled embeddings, query_pre_attn_scalar, soft-capped scores
// and logits, local and global layers, Gemma 3's q/k norms, local RoPE base
// and global rope_scaling); the training loss and every weight's gradient
// against the reference's autograd; export giving back every source tensor
// byte for byte and a config.json the reference reads to the same logits;
// generation through the KV cache equal to recomputing the whole sequence,
// past the window; and the refusals.
#include <gtest/gtest.h>

#include "hf_test_util.h"
#include "infer/generate.h"
#include "model/arch.h"

namespace nk {
namespace {

using namespace nk::test;
using nlohmann::json;

constexpr double kTol = 1e-5;

struct GemmaCase {
  const char* name;
  const char* arch;
  const char* hf_class;
  json extra;  // spec keys over the defaults
};

void PrintTo(const GemmaCase& g, std::ostream* os) {
  *os << g.name;
}

// 6 layers (Gemma 3's pattern of five local, one global), a window of 8
// under sequences of 20, heads of 16 whose 4 x 16 is not the width.
json spec_of(const GemmaCase& g) {
  json s = {{"arch", g.arch}, {"vocab", 97}, {"ctx", 64},     {"layers", 6},
            {"hidden", 32},   {"heads", 4},  {"kv_heads", 2}, {"ffn", 48},
            {"head_dim", 16}, {"window", 8}, {"tied", true},  {"dtype", "F32"},
            {"shards", 1},    {"seed", 17},  {"seq", 20},     {"new_tokens", 6}};
  for (auto& [k, v] : g.extra.items()) s[k] = v;
  return s;
}

const GemmaCase kCases[] = {
    {"gemma2", "gemma2", "Gemma2ForCausalLM", json::object()},
    // Caps that bite (scores and logits well past c), a scale apart from head_dim.
    {"gemma2_capped",
     "gemma2",
     "Gemma2ForCausalLM",
     {{"attn_cap", 0.5}, {"final_cap", 1.5}, {"qpas", 24}, {"std", 0.4}}},
    {"gemma3", "gemma3", "Gemma3ForCausalLM", json::object()},
    // rope_scaling on the global layers only; the layers listed (layer_types);
    // a pattern of 3.
    {"gemma3_scaled",
     "gemma3",
     "Gemma3ForCausalLM",
     {{"rope_scaling", {{"rope_type", "linear"}, {"factor", 4.0}}},
      {"pattern", 3},
      {"layer_types",
       {"sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
        "sliding_attention", "full_attention"}}}},
};

class HfGemma : public ::testing::TestWithParam<GemmaCase> {};

TEST_P(HfGemma, ImportMatchesReference) {
  const GemmaCase& g = GetParam();
  TempDir tmp("nk_hf_gemma");
  const json spec = spec_of(g);
  std::string hf = write_hf(tmp, g.name, spec);
  HfImportReport rep = import_hf(hf, tmp / "nk");
  EXPECT_EQ(rep.architecture, g.hf_class);
  EXPECT_EQ(rep.config.arch, g.arch);
  const ModelConfig& c = rep.config;
  EXPECT_EQ(c.head_dim(), 16);
  EXPECT_EQ(c.sliding_window, 8);
  EXPECT_TRUE(c.tied_embeddings);
  const bool gemma3 = std::string(g.arch) == "gemma3";
  const int64_t P = spec.value("pattern", gemma3 ? 6 : 2);
  EXPECT_EQ(c.sliding_window_pattern, P);
  for (int64_t l = 0; l < c.n_layer; ++l) EXPECT_EQ(c.layer_local(l), (l + 1) % P != 0) << l;
  EXPECT_DOUBLE_EQ(c.rope_local_theta, gemma3 ? 10000.0 : 0.0);
  EXPECT_DOUBLE_EQ(c.query_pre_attn_scalar, spec.value("qpas", 16.0));
  EXPECT_DOUBLE_EQ(c.attn_logit_softcap, gemma3 ? 0.0 : spec.value("attn_cap", 50.0));
  EXPECT_DOUBLE_EQ(c.final_logit_softcap, gemma3 ? 0.0 : spec.value("final_cap", 30.0));
  expect_matches_reference(tmp, g.name, tmp / "nk", kTol);
}

TEST_P(HfGemma, ExportReproducesEverySourceTensor) {
  const GemmaCase& g = GetParam();
  TempDir tmp("nk_hf_gemma");
  for (const char* dtype : {"F32", "BF16"}) {
    SCOPED_TRACE(dtype);
    json spec = spec_of(g);
    spec["dtype"] = dtype;
    const std::string name = std::string(g.name) + "_" + dtype;
    std::string hf = write_hf(tmp, name, spec);
    ASSERT_EQ(run_nekton("import hf " + hf + " " + (tmp / (name + "_nk"))).code, 0);
    RunResult r =
        run_nekton("export hf " + (tmp / (name + "_nk")) + " " + (tmp / (name + "_back")));
    ASSERT_EQ(r.code, 0) << r.out;
    auto src = hf_tensors(hf), out = hf_tensors(tmp / (name + "_back"));
    ASSERT_EQ(out.size(), src.size());
    for (auto& [t, raw] : src) EXPECT_TRUE(out[t] == raw) << t;
    json in = read_json(hf + "/config.json"), back = read_json(tmp / (name + "_back/config.json"));
    EXPECT_EQ(back["architectures"][0], g.hf_class);
    EXPECT_EQ(back["model_type"], in["model_type"]);
    for (const char* key :
         {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "rope_theta",
          "rope_scaling", "tie_word_embeddings", "query_pre_attn_scalar", "sliding_window",
          "attn_logit_softcapping", "final_logit_softcapping", "rope_local_base_freq",
          "hidden_activation", "attention_bias", "layer_types"})
      if (in.contains(key)) {
        EXPECT_EQ(back[key], in[key]) << key;
      }
    // The reference reads the export (its layer_types) to Nekton's logits,
    // at positions past the window.
    auto model = load_model(tmp / (name + "_nk"), DType::F32);
    write_nekton_results(*model, tmp / (name + ".nekton.safetensors"), 20);
    expect_reference_agrees(tmp / (name + "_back"), tmp / (name + ".nekton.safetensors"), name,
                            std::string(dtype) == "F32" ? kTol : kHfTol);
  }
}

// The training loss and every weight's gradient (the (1 + w) norms' and
// post norms', the q/k norms', the tied embedding's through both of its
// uses) against the reference's autograd, over rows past the window.
TEST_P(HfGemma, LossAndGradientsMatchReferenceAutograd) {
  const GemmaCase& g = GetParam();
  TempDir tmp("nk_hf_gemma");
  std::string hf = write_hf(tmp, g.name, spec_of(g));
  import_hf(hf, tmp / "nk");
  auto model = load_model(tmp / "nk", DType::F32);
  const ModelConfig& c = model->config();
  const int64_t B = 2, T = 20, V = c.vocab_size;
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
  std::cout << "[ " << g.name << " ] loss " << loss << " (reference " << want_loss[0] << ")\n";
  EXPECT_NEAR(loss, want_loss[0], 1e-5 * std::abs(want_loss[0]));
  double worst = 0;
  int64_t n = 0;
  for (const ExternalTensor& e : c.architecture().hf_tensors(c, "")) {
    const ParamInfo& p = model->layout().find(e.param);
    Tensor gr = e.part.empty() ? ParamLayout::view(model->grads(), p)
                               : ParamLayout::part_view(model->grads(), p, e.part);
    const double rel = max_rel_diff(gr, ref.get(e.name));
    worst = std::max(worst, rel);
    ++n;
    EXPECT_LT(rel, 1e-4) << e.name;
  }
  std::cout << "[ " << g.name << " ] gradients of " << n << " tensors: worst max relative "
            << "difference " << worst << "\n";
}

INSTANTIATE_TEST_SUITE_P(Archs, HfGemma, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

// Generation with the KV cache (prefill in chunks, then token by token) gives
// the tokens of recomputing the whole sequence each step, the prompt and the
// continuation well past the window (per layer: local and global layers,
// soft-capped scores and logits); bf16 runs too.
TEST(HfGemmaGenerate, KvCacheGenerationEqualsRecompute) {
  for (const char* preset : {"gemma2-tiny", "gemma3-tiny"})
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(preset) + " " + dtype_name(dt));
      ModelConfig c = model_preset(preset);
      c.vocab_size = 97;
      c.init_std = 0.3;
      c.sliding_window = 12;
      if (std::string(preset) == "gemma2-tiny") {  // caps that bite
        c.attn_logit_softcap = 2.0;
        c.final_logit_softcap = 3.0;
      }
      Transformer model(c, dt, 11);
      std::vector<int32_t> prompt;
      for (int i = 0; i < 30; ++i) prompt.push_back(int32_t((i * 29 + 3) % 97));
      std::vector<int32_t> want;
      if (dt == DType::F32) want = greedy(model, prompt, 16);
      Generator gen(model, nullptr, 2, /*prefill_chunk=*/7);
      GenerationRequest req;
      req.prompt = prompt;
      req.max_new_tokens = 16;
      req.sampling.temperature = 0;
      const int64_t id = gen.submit(req);
      while (!gen.finished(id)) gen.step();
      if (dt == DType::F32)
        EXPECT_EQ(gen.result(id).tokens, want);
      else
        EXPECT_EQ(gen.result(id).tokens.size(), 16u);
    }
}

// What cannot be built is refused at import, naming the key.
TEST(HfGemmaRefusals, UnsupportedSettingsNameTheKey) {
  TempDir tmp("nk_hf_gemma");
  const GemmaCase g{"g", "gemma3", "Gemma3ForCausalLM", json::object()};
  std::string hf = write_hf(tmp, "g", spec_of(g));
  const json cfg = read_json(hf + "/config.json");
  for (auto [key, value, says] : {std::tuple<const char*, json, const char*>{
                                      "hidden_activation", "gelu", "gelu_pytorch_tanh"},
                                  {"attention_bias", true, "without biases"},
                                  {"layer_types",
                                   {"sliding_attention", "full_attention", "sliding_attention",
                                    "sliding_attention", "sliding_attention", "full_attention"},
                                   "layer 3"},
                                  {"layer_types", {"full_attention"}, "6 layers"}}) {
    json bad = cfg;
    bad[key] = value;
    write_json(hf + "/config.json", bad);
    const std::string err = error_of([&] { import_hf(hf, tmp / "nk_bad"); });
    EXPECT_TRUE(contains(err, says)) << err;
    EXPECT_TRUE(contains(err, key)) << err;
  }
}

}  // namespace
}  // namespace nk
