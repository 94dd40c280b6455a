// GGUF export and import of a Mixture-of-Experts model (Mixtral) in
// llama.cpp's layout: arch "llama" with llama.expert_count and
// expert_used_count, the router blk.L.ffn_gate_inp.weight [E, C] (f32 under
// every recipe), the experts stacked per layer as ffn_gate_exps and
// ffn_up_exps [E, F, C] and ffn_down_exps [E, C, F]. Import gives back every
// parameter bit for bit at f32; block-quantised files load with the experts'
// blocks kept and compute a dense model's logits on the same weights within
// the activations' rounding. generate runs such a file and a Mixtral folder
// with generate.quantize. llama.cpp itself runs the files in
// gguf_llama_cpp_test.cc (MixtralLogitsAndGreedy). DeepSeek's deepseek2 files
// (Multi-head Latent Attention) read back exactly too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <tuple>

#include "ckpt/gguf_export.h"
#include "ckpt/gguf_import.h"
#include "ckpt/gguf_reader.h"
#include "ckpt/gguf_writer.h"
#include "gguf_test_util.h"
#include "model/arch.h"
#include "model/full_logits.h"

namespace nk {
namespace {

using namespace test;

// Rows of 256 everywhere (k-quants' block), E experts, top-2.
ModelConfig quant_mixtral(int64_t experts) {
  ModelConfig c = model_preset("mixtral-tiny");
  c.vocab_size = 416;
  c.max_seq_len = 64;
  c.num_experts = experts;
  c.d_model = 256;
  c.d_ff = c.moe_d_ff = 256;
  c.init_std = 0.05;
  return c;
}

std::vector<float> logits_of(Transformer& m, const std::vector<int32_t>& tokens) {
  const int64_t T = int64_t(tokens.size()), V = m.config().vocab_size;
  Activations acts(m, 1, T, false);
  Tensor tok = Tensor::empty({1, T}, DType::I32);
  std::copy(tokens.begin(), tokens.end(), tok.data<int32_t>());
  Tensor logits = Tensor::empty({T, V}, DType::F32);
  m.forward_all_logits(acts, tok, logits);
  return std::vector<float>(logits.data<float>(), logits.data<float>() + T * V);
}

std::unique_ptr<Transformer> dense_copy(const Transformer& q) {
  auto d = std::make_unique<Transformer>(q.config(), DType::F32, 0, ParamInit::Zeros);
  for (const ParamInfo& p : d->layout().params())
    d->set_param(p, q.param_f32(q.layout().find(p.name)));
  return d;
}

struct MoeGguf : ::testing::Test {
  TempDir dir{"gguf_moe"};
  std::string spm;
  std::vector<int32_t> prompt;
  void SetUp() override {
    spm = train_small_spm(dir, 400);
    auto tok = SentencePieceTokenizer::open(spm);
    prompt = {tok->bos_id()};
    for (int32_t t : tok->encode("The quick brown fox jumps over the lazy dog, déjà vu."))
      prompt.push_back(t);
  }
  std::string saved(int64_t experts) {
    std::string d = dir / fmt::format("model{}", experts);
    if (!std::filesystem::exists(d)) save_tiny_model(d, quant_mixtral(experts), 70 + experts, spm);
    return d;
  }
  std::string exported(int64_t experts, const std::string& type) {
    std::string gguf = dir / fmt::format("m{}-{}.gguf", experts, type);
    RunResult r = run_nekton(fmt::format("quantize {} {} --type {}", saved(experts), gguf, type));
    EXPECT_EQ(r.code, 0) << r.out;
    return gguf;
  }
};

TEST_F(MoeGguf, LlamaCppsNamesShapesAndF32RoundTripIsExact) {
  const std::string gguf = exported(4, "f32");
  auto f = GgufFile::open(gguf);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("llama.expert_count"), 4);
  EXPECT_EQ(f->get_int("llama.expert_used_count"), 2);
  EXPECT_EQ(f->get_int("llama.feed_forward_length"), 256);
  EXPECT_EQ(f->tensor("blk.1.ffn_gate_inp.weight").shape, (Shape{4, 256}));
  EXPECT_EQ(f->tensor("blk.1.ffn_gate_exps.weight").shape, (Shape{4, 256, 256}));
  EXPECT_EQ(f->tensor("blk.1.ffn_up_exps.weight").shape, (Shape{4, 256, 256}));
  EXPECT_EQ(f->tensor("blk.1.ffn_down_exps.weight").shape, (Shape{4, 256, 256}));
  EXPECT_EQ(f->find("blk.0.ffn_gate.weight"), nullptr);
  auto original = load_model(saved(4), DType::F32);
  // Slice e of ffn_gate_exps is expert e's gate rows; of ffn_up_exps its up
  // rows; of ffn_down_exps its down projection.
  const ParamInfo& up = original->layout().find("h.1.moe.up.weight");
  const ParamInfo& down = original->layout().find("h.1.moe.down.weight");
  const Tensor upw = original->param_f32(up), downw = original->param_f32(down);
  const int64_t F = 256, C = 256;
  std::vector<float> row(static_cast<size_t>(C));
  gguf_decode_rows(f->tensor("blk.1.ffn_gate_exps.weight"), 2 * F + 5, 1, row.data());
  EXPECT_EQ(0, std::memcmp(row.data(), upw.data<float>() + (2 * 2 * F + 5) * C, 4 * C));
  gguf_decode_rows(f->tensor("blk.1.ffn_up_exps.weight"), 3 * F + 7, 1, row.data());
  EXPECT_EQ(0, std::memcmp(row.data(), upw.data<float>() + (3 * 2 * F + F + 7) * C, 4 * C));
  gguf_decode_rows(f->tensor("blk.1.ffn_down_exps.weight"), 1 * C + 9, 1, row.data());
  EXPECT_EQ(0, std::memcmp(row.data(), downw.data<float>() + (1 * C + 9) * F, 4 * F));

  GgufModel g = load_gguf_model(gguf);
  EXPECT_EQ(g.model->config().arch, "mixtral");
  EXPECT_EQ(g.model->config().num_experts, 4);
  EXPECT_EQ(g.model->config().num_experts_per_tok, 2);
  EXPECT_EQ(g.model->config().expert_d_ff(), 256);
  for (const ParamInfo& p : original->layout().params()) {
    Tensor a = original->param_f32(p), b = g.model->param_f32(g.model->layout().find(p.name));
    ASSERT_EQ(0, std::memcmp(a.raw(), b.raw(), a.nbytes())) << p.name;
  }
  EXPECT_EQ(logits_of(*original, prompt), logits_of(*g.model, prompt));
}

// Mixtral's q4_k_m (8 experts) as llama.cpp's quantiser chooses it: the
// router f32, attn_k and attn_v q8_0, attn_output q6_k (llama.cpp's q5_k),
// ffn_down_exps q6_k in the more-bits layers (the last of two) and q4_k
// elsewhere, gate and up experts q4_k, the output q6_k.
TEST_F(MoeGguf, Q4KMRecipeForEightExperts) {
  const std::string gguf = exported(8, "q4_k_m");
  auto f = GgufFile::open(gguf);
  auto type = [&](const std::string& n) { return GgmlType(f->tensor(n).type); };
  EXPECT_EQ(type("blk.0.ffn_gate_inp.weight"), GgmlType::F32);
  EXPECT_EQ(type("blk.0.attn_k.weight"), GgmlType::Q8_0);
  EXPECT_EQ(type("blk.0.attn_v.weight"), GgmlType::Q8_0);
  EXPECT_EQ(type("blk.0.attn_q.weight"), GgmlType::Q4_K);
  EXPECT_EQ(type("blk.0.attn_output.weight"), GgmlType::Q6_K);
  EXPECT_EQ(type("blk.0.ffn_gate_exps.weight"), GgmlType::Q4_K);
  EXPECT_EQ(type("blk.0.ffn_up_exps.weight"), GgmlType::Q4_K);
  EXPECT_EQ(type("blk.0.ffn_down_exps.weight"), GgmlType::Q4_K);
  EXPECT_EQ(type("blk.1.ffn_down_exps.weight"), GgmlType::Q6_K);
  EXPECT_EQ(type("output.weight"), GgmlType::Q6_K);
  // With 4 experts llama.cpp's Mixtral rules do not apply: attn_k as attn_q.
  auto f4 = GgufFile::open(exported(4, "q4_k_m"));
  EXPECT_EQ(GgmlType(f4->tensor("blk.0.attn_k.weight").type), GgmlType::Q4_K);
  EXPECT_EQ(GgmlType(f4->tensor("blk.0.ffn_gate_inp.weight").type), GgmlType::F32);
  // The imported model holds the blocks: q (q4_k) then k and v (q8_0).
  GgufModel g = load_gguf_model(gguf);
  auto& qkv = g.model->quant_parts("h.0.attn.qkv.weight");
  ASSERT_EQ(qkv.size(), 2u);
  EXPECT_EQ(qkv[1].type, ops::QuantType::Q8_0);
  EXPECT_EQ(g.model->quant_parts("h.1.moe.down.weight")[0].type, ops::QuantType::Q6_K);
  EXPECT_FALSE(g.model->layout().find("h.0.moe.router.weight").quantized);
}

// Each recipe's file, imported with its blocks kept, against a dense model
// on the same (dequantised) weights: within the activations' rounding
// (0.12 of the logits' RMS, the dense models' bound in gguf_import_test.cc),
// for 1 token (decode), 3 and the whole prompt; f16 and bf16 tighter. Every
// token goes to all 4 experts here (top-4: every expert's rows are read, so
// a misplaced one shows): with top-2, the activations' rounding moves a
// random router's near-ties to other experts (measured: q8_0 0.52 of the
// RMS at one position, where the other types stayed at 0.05), which is a
// step of the model, not an error of the weights.
TEST_F(MoeGguf, EveryTypeComputesItsWeights) {
  {
    ModelConfig c = quant_mixtral(4);
    c.num_experts_per_tok = 4;
    save_tiny_model(dir / "model-top4", c, 74, spm);
  }
  auto original = load_model(dir / "model-top4", DType::F32);
  for (const auto& [type, tol] : std::vector<std::pair<std::string, double>>{{"f16", 1e-5},
                                                                             {"bf16", 1e-5},
                                                                             {"q8_0", 0.12},
                                                                             {"q4_0", 0.12},
                                                                             {"q4_k", 0.12},
                                                                             {"q6_k", 0.12},
                                                                             {"q4_k_m", 0.12}}) {
    SCOPED_TRACE(type);
    const std::string gguf = dir / ("top4-" + type + ".gguf");
    RunResult r =
        run_nekton(fmt::format("quantize {} {} --type {}", dir / "model-top4", gguf, type));
    ASSERT_EQ(r.code, 0) << r.out;
    GgufModel g = load_gguf_model(gguf);
    g.model->pack_quant_weights();  // as generate and serve load it
    auto dense = dense_copy(*g.model);
    double err = 0;
    for (size_t n : {size_t(1), size_t(3), prompt.size()}) {
      const std::vector<int32_t> t(prompt.begin(), prompt.begin() + long(n));
      err = std::max(err, test::rel_max_diff(logits_of(*g.model, t), logits_of(*dense, t)));
    }
    const double vs_orig =
        test::rel_max_diff(logits_of(*g.model, prompt), logits_of(*original, prompt));
    std::cout << fmt::format(
        "[mixtral gguf {}] weights {} bytes; max |logit diff| / RMS vs dense on the same weights "
        "{:.3g}; vs the f32 original {:.3g}\n",
        type, g.model->weight_bytes(), err, vs_orig);
    EXPECT_LE(err, tol);
  }
}

// `nekton quantize IN.gguf OUT.gguf` of a Mixtral file: the stacked experts
// requantised as 3-d tensors, the router kept f32.
TEST_F(MoeGguf, RequantizeAMixtralGguf) {
  const std::string out = dir / "re.gguf";
  RunResult r = run_nekton(fmt::format("quantize {} {} --type q8_0", exported(4, "f16"), out));
  ASSERT_EQ(r.code, 0) << r.out;
  auto f = GgufFile::open(out);
  EXPECT_EQ(GgmlType(f->tensor("blk.0.ffn_up_exps.weight").type), GgmlType::Q8_0);
  EXPECT_EQ(f->tensor("blk.0.ffn_up_exps.weight").shape, (Shape{4, 256, 256}));
  EXPECT_EQ(GgmlType(f->tensor("blk.0.ffn_gate_inp.weight").type), GgmlType::F32);
  GgufModel g = load_gguf_model(out);
  EXPECT_EQ(g.model->config().num_experts, 4);
}

TEST_F(MoeGguf, GenerateRunsTheFileAndQuantisesAFolder) {
  RunResult r = run_nekton(
      fmt::format("generate generate.model={} generate.prompt=Hello generate.max_tokens=8 "
                  "generate.temperature=0",
                  exported(4, "q4_k_m")));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Hello"), std::string::npos) << r.out;
  for (const char* q : {"q8_0", "q4_k"}) {
    r = run_nekton(
        fmt::format("generate generate.model={} generate.prompt=Hello generate.max_tokens=8 "
                    "generate.temperature=0 generate.quantize={}",
                    saved(4), q));
    EXPECT_EQ(r.code, 0) << q << ": " << r.out;
    EXPECT_NE(r.out.find("Hello"), std::string::npos) << r.out;
  }
}

// A file claiming experts for an architecture Nekton has no MoE form of is
// refused naming the key.
TEST_F(MoeGguf, ExpertsOfAnArchitectureWithoutMoeAreRefused) {
  const std::string gguf = exported(4, "f32");
  // Rewritten with general.architecture qwen2 and qwen2.expert_count.
  auto f = GgufFile::open(gguf);
  GgufWriter w;
  for (const GgufFile::RawKv& kv : f->raw_metadata()) {
    std::string key = kv.key;
    if (key == "general.architecture") continue;
    if (key.rfind("llama.", 0) == 0) key = "qwen2." + key.substr(6);
    w.add_raw(key, kv.type, kv.bytes);
  }
  w.add_string("general.architecture", "qwen2");
  for (const GgufFile::TensorInfo& t : f->tensors()) {
    const GgufFile::TensorInfo* src = &t;
    w.add_tensor(t.name, t.shape, GgmlType(t.type), [src](std::vector<float>& out) {
      out.resize(size_t(shape_numel(src->shape)));
      gguf_decode_rows(*src, 0, shape_numel(src->shape) / src->shape.back(), out.data());
    });
  }
  const std::string bad = dir / "qwen2-experts.gguf";
  w.write(bad);
  std::string e;
  try {
    load_gguf_model(bad);
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("qwen2.expert_count = 4"), std::string::npos) << e;
  EXPECT_NE(e.find(bad), std::string::npos) << e;
}

// Qwen2-MoE (shared expert, gated), Qwen3-MoE and dense Qwen3 with rows of
// 256 (k-quants' block); the Qwen3 ones with heads of 128 over d_model 256
// (4 x 128 = 512: a head size apart from d_model / n_head, as Qwen3's).
ModelConfig quant_qwen(const std::string& preset) {
  ModelConfig c = model_preset(preset);
  c.vocab_size = 416;
  c.max_seq_len = 64;
  c.d_model = 256;
  c.d_ff = 256;
  if (c.is_moe()) c.moe_d_ff = 256;
  if (c.moe_shared_d_ff > 0) c.moe_shared_d_ff = 512;
  if (c.attn_head_dim > 0) c.attn_head_dim = 128;  // 4 heads x 128 = 512, not 256
  c.init_std = 0.05;
  return c;
}

// llama.cpp's qwen2moe, qwen3moe and qwen3 layouts: the architecture names,
// the experts' widths under expert_feed_forward_length and
// expert_shared_feed_forward_length (feed_forward_length the dense MLP's),
// the head size as attention.key_length, the q/k norms as attn_q_norm /
// attn_k_norm [head_dim], the shared expert as ffn_{gate,up,down}_shexp and
// its gate as the 1-d ffn_gate_inp_shexp [C]; an f32 file imported back
// gives every parameter bit for bit, and the same logits.
TEST_F(MoeGguf, QwenLayoutsAndF32RoundTripIsExact) {
  struct Case {
    const char* preset;
    const char* ga;
  };
  for (const Case& k : {Case{"qwen2-moe-tiny", "qwen2moe"}, Case{"qwen3-moe-tiny", "qwen3moe"},
                        Case{"qwen3-tiny", "qwen3"}}) {
    SCOPED_TRACE(k.preset);
    const ModelConfig c = quant_qwen(k.preset);
    const std::string model_dir = dir / k.preset, gguf = dir / (std::string(k.preset) + ".gguf");
    save_tiny_model(model_dir, c, 90, spm);
    RunResult r = run_nekton(fmt::format("export gguf {} {} --type f32", model_dir, gguf));
    ASSERT_EQ(r.code, 0) << r.out;
    auto f = GgufFile::open(gguf);
    const std::string ga = k.ga;
    EXPECT_EQ(f->get_string("general.architecture"), ga);
    EXPECT_EQ(f->get_int(ga + ".feed_forward_length"), 256);
    const int64_t D = c.head_dim(), Q = c.n_head * D, KV = c.n_kv_head * D;
    EXPECT_EQ(f->tensor("blk.1.attn_q.weight").shape, (Shape{Q, 256}));
    EXPECT_EQ(f->tensor("blk.1.attn_k.weight").shape, (Shape{KV, 256}));
    EXPECT_EQ(f->tensor("blk.1.attn_output.weight").shape, (Shape{256, Q}));
    if (c.arch != "qwen2_moe") {
      EXPECT_EQ(f->get_int(ga + ".attention.key_length"), 128);
      EXPECT_EQ(f->get_int(ga + ".attention.value_length"), 128);
      EXPECT_EQ(f->tensor("blk.1.attn_q_norm.weight").shape, (Shape{128}));
      EXPECT_EQ(f->tensor("blk.1.attn_k_norm.weight").shape, (Shape{128}));
      EXPECT_EQ(f->find("blk.1.attn_q.bias"), nullptr);
    } else {
      EXPECT_FALSE(f->has(ga + ".attention.key_length"));
      EXPECT_EQ(f->tensor("blk.1.attn_q.bias").shape, (Shape{256}));
    }
    if (c.is_moe()) {
      EXPECT_EQ(f->get_int(ga + ".expert_count"), c.num_experts);
      EXPECT_EQ(f->get_int(ga + ".expert_used_count"), 2);
      EXPECT_EQ(f->get_int(ga + ".expert_feed_forward_length"), 256);
      const int64_t E = c.num_experts;
      EXPECT_EQ(f->tensor("blk.1.ffn_gate_inp.weight").shape, (Shape{E, 256}));
      EXPECT_EQ(f->tensor("blk.1.ffn_gate_exps.weight").shape, (Shape{E, 256, 256}));
      EXPECT_EQ(f->tensor("blk.1.ffn_down_exps.weight").shape, (Shape{E, 256, 256}));
      EXPECT_EQ(f->find("blk.0.ffn_gate.weight"), nullptr);
    } else {
      EXPECT_EQ(f->tensor("blk.1.ffn_gate.weight").shape, (Shape{256, 256}));
    }
    if (c.moe_shared_d_ff > 0) {
      EXPECT_EQ(f->get_int(ga + ".expert_shared_feed_forward_length"), 512);
      EXPECT_EQ(f->tensor("blk.1.ffn_gate_inp_shexp.weight").shape, (Shape{256}));
      EXPECT_EQ(GgmlType(f->tensor("blk.1.ffn_gate_inp_shexp.weight").type), GgmlType::F32);
      EXPECT_EQ(f->tensor("blk.1.ffn_gate_shexp.weight").shape, (Shape{512, 256}));
      EXPECT_EQ(f->tensor("blk.1.ffn_up_shexp.weight").shape, (Shape{512, 256}));
      EXPECT_EQ(f->tensor("blk.1.ffn_down_shexp.weight").shape, (Shape{256, 512}));
    } else {
      EXPECT_EQ(f->find("blk.1.ffn_gate_shexp.weight"), nullptr);
    }
    auto original = load_model(model_dir, DType::F32);
    GgufModel g = load_gguf_model(gguf);
    const ModelConfig& b = g.model->config();
    EXPECT_EQ(b.arch, c.arch);
    EXPECT_EQ(b.head_dim(), c.head_dim());
    EXPECT_EQ(b.num_experts, c.num_experts);
    EXPECT_EQ(b.expert_d_ff(), c.expert_d_ff());
    EXPECT_EQ(b.moe_shared_d_ff, c.moe_shared_d_ff);
    EXPECT_EQ(b.moe_shared_expert_gate, c.moe_shared_expert_gate);
    EXPECT_EQ(b.norm_topk_prob, c.norm_topk_prob);
    EXPECT_EQ(b.tied_embeddings, c.tied_embeddings);
    for (const ParamInfo& p : original->layout().params()) {
      Tensor x = original->param_f32(p), y = g.model->param_f32(g.model->layout().find(p.name));
      ASSERT_EQ(0, std::memcmp(x.raw(), y.raw(), x.nbytes())) << p.name;
    }
    EXPECT_EQ(logits_of(*original, prompt), logits_of(*g.model, prompt));
  }
}

// Each block type's Qwen-MoE file (nekton quantize), imported with its
// blocks kept, against a dense model on the same weights (top-all routing,
// as EveryTypeComputesItsWeights): the experts and the shared expert held
// in blocks, the router and the shared expert's gate f32; generate runs the
// q4_k_m file, and a model folder with generate.quantize=q8_0 and q4_k.
TEST_F(MoeGguf, QwenMoeQuantizedFilesAndGenerate) {
  for (const char* preset : {"qwen2-moe-tiny", "qwen3-moe-tiny"}) {
    SCOPED_TRACE(preset);
    ModelConfig c = quant_qwen(preset);
    c.num_experts_per_tok = c.num_experts;
    const std::string model_dir = dir / (std::string(preset) + "-all");
    save_tiny_model(model_dir, c, 91, spm);
    for (const char* type : {"q8_0", "q4_k", "q4_k_m"}) {
      SCOPED_TRACE(type);
      const std::string gguf = dir / fmt::format("{}-{}.gguf", preset, type);
      RunResult r = run_nekton(fmt::format("quantize {} {} --type {}", model_dir, gguf, type));
      ASSERT_EQ(r.code, 0) << r.out;
      auto f = GgufFile::open(gguf);
      EXPECT_EQ(GgmlType(f->tensor("blk.0.ffn_gate_inp.weight").type), GgmlType::F32);
      GgufModel g = load_gguf_model(gguf);
      EXPECT_TRUE(g.model->layout().find("h.0.moe.up.weight").quantized);
      EXPECT_FALSE(g.model->layout().find("h.0.moe.router.weight").quantized);
      if (c.moe_shared_d_ff > 0) {
        EXPECT_TRUE(g.model->layout().find("h.1.moe.shared_down.weight").quantized);
        EXPECT_FALSE(g.model->layout().find("h.1.moe.shared_gate.weight").quantized);
      }
      g.model->pack_quant_weights();  // as generate and serve load it
      auto dense = dense_copy(*g.model);
      double err = 0;
      for (size_t n : {size_t(1), size_t(3), prompt.size()}) {
        const std::vector<int32_t> t(prompt.begin(), prompt.begin() + long(n));
        err = std::max(err, test::rel_max_diff(logits_of(*g.model, t), logits_of(*dense, t)));
      }
      std::cout << fmt::format("[{} gguf {}] max |logit diff| / RMS vs dense {:.3g}\n", preset,
                               type, err);
      EXPECT_LE(err, 0.12);
      if (std::string(type) == "q4_k_m") {
        r = run_nekton(
            fmt::format("generate generate.model={} generate.prompt=Hello generate.max_tokens=8 "
                        "generate.temperature=0",
                        gguf));
        EXPECT_EQ(r.code, 0) << r.out;
        EXPECT_NE(r.out.find("Hello"), std::string::npos) << r.out;
      }
    }
    for (const char* q : {"q8_0", "q4_k"}) {
      RunResult r = run_nekton(
          fmt::format("generate generate.model={} generate.prompt=Hello generate.max_tokens=8 "
                      "generate.temperature=0 generate.quantize={}",
                      model_dir, q));
      EXPECT_EQ(r.code, 0) << q << ": " << r.out;
      EXPECT_NE(r.out.find("Hello"), std::string::npos) << r.out;
    }
  }
}

// A tied Qwen2-MoE head goes to output.weight as well (llama.cpp's qwen2moe
// requires it) and comes back as an untied model with the same values; a
// router llama.cpp's graph would run otherwise is refused naming its keys:
// Qwen2-MoE renormalising its top-k, Qwen3-MoE not, a layer with a dense
// MLP among MoE ones.
TEST_F(MoeGguf, QwenMoeTiedHeadAndRefusedRouters) {
  ModelConfig c = quant_qwen("qwen2-moe-tiny");
  c.tied_embeddings = true;
  save_tiny_model(dir / "tied", c, 92, spm);
  RunResult r =
      run_nekton(fmt::format("export gguf {} {} --type f32", dir / "tied", dir / "t.gguf"));
  ASSERT_EQ(r.code, 0) << r.out;
  auto original = load_model(dir / "tied", DType::F32);
  GgufModel g = load_gguf_model(dir / "t.gguf");
  EXPECT_FALSE(g.model->config().tied_embeddings);
  EXPECT_EQ(logits_of(*original, prompt), logits_of(*g.model, prompt));

  struct Bad {
    const char* preset;
    std::function<void(ModelConfig&)> edit;
    const char* says;
  };
  for (const Bad& b : {Bad{"qwen2-moe-tiny", [](ModelConfig& m) { m.norm_topk_prob = true; },
                           "norm_topk_prob = true"},
                       Bad{"qwen3-moe-tiny", [](ModelConfig& m) { m.norm_topk_prob = false; },
                           "norm_topk_prob = false"},
                       Bad{"qwen3-moe-tiny", [](ModelConfig& m) { m.moe_first_dense_layers = 1; },
                           "layer 0 has a dense MLP"}}) {
    SCOPED_TRACE(b.says);
    ModelConfig m = quant_qwen(b.preset);
    b.edit(m);
    const std::string d = dir / "bad", out = dir / "bad.gguf";
    std::filesystem::remove_all(d);
    save_tiny_model(d, m, 93, spm);
    r = run_nekton(fmt::format("export gguf {} {}", d, out));
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.out.find(b.says), std::string::npos) << r.out;
    EXPECT_FALSE(std::filesystem::exists(out));
  }
}

// dots.llm1 in llama.cpp's dots1 layout: the routing in the metadata
// (leading_dense_block_count, expert_gating_func 2 = sigmoid,
// expert_weights_norm, expert_weights_scale, expert_shared_count, the
// groups), the dense first layer's ffn_{gate,up,down}, the MoE layers'
// exp_probs_b.bias and ungated ffn_*_shexp; the f32 file imports back bit
// for bit; a q4_k_m file loads with its experts' blocks kept and generates.
// Dense layers other than leading ones, and fewer key/value heads than
// query heads (llama.cpp's dots1 has none), are refused naming the key.
TEST_F(MoeGguf, Dots1LayoutRoundTripAndQuantized) {
  ModelConfig c = model_preset("dots1-tiny");
  c.vocab_size = 416;
  c.max_seq_len = 64;
  c.d_model = 256;
  c.d_ff = 256;
  c.moe_d_ff = 256;
  c.moe_shared_d_ff = 512;
  c.n_kv_head = c.n_head;
  c.init_std = 0.05;
  save_tiny_model(dir / "dots1", c, 94, spm);
  const std::string gguf = dir / "dots1.gguf";
  RunResult r = run_nekton(fmt::format("export gguf {} {} --type f32", dir / "dots1", gguf));
  ASSERT_EQ(r.code, 0) << r.out;
  auto f = GgufFile::open(gguf);
  EXPECT_EQ(f->get_string("general.architecture"), "dots1");
  EXPECT_EQ(f->get_int("dots1.leading_dense_block_count"), 1);
  EXPECT_EQ(f->get_int("dots1.expert_gating_func"), 2);
  EXPECT_EQ(f->get_int("dots1.expert_shared_count"), 2);
  EXPECT_EQ(f->get_int("dots1.expert_group_count"), 4);
  EXPECT_EQ(f->get_int("dots1.expert_group_used_count"), 2);
  EXPECT_TRUE(f->get_bool("dots1.expert_weights_norm"));
  EXPECT_FLOAT_EQ(float(f->get_float("dots1.expert_weights_scale")), 2.5f);
  EXPECT_EQ(f->tensor("blk.0.ffn_gate.weight").shape, (Shape{256, 256}));
  EXPECT_EQ(f->find("blk.0.ffn_gate_inp.weight"), nullptr);
  EXPECT_EQ(f->tensor("blk.1.exp_probs_b.bias").shape, (Shape{8}));
  EXPECT_EQ(f->tensor("blk.1.ffn_gate_exps.weight").shape, (Shape{8, 256, 256}));
  EXPECT_EQ(f->tensor("blk.1.ffn_down_shexp.weight").shape, (Shape{256, 512}));
  EXPECT_EQ(f->find("blk.1.ffn_gate_inp_shexp.weight"), nullptr);
  auto original = load_model(dir / "dots1", DType::F32);
  GgufModel g = load_gguf_model(gguf);
  for (const ParamInfo& p : original->layout().params()) {
    Tensor x = original->param_f32(p), y = g.model->param_f32(g.model->layout().find(p.name));
    ASSERT_EQ(0, std::memcmp(x.raw(), y.raw(), x.nbytes())) << p.name;
  }
  EXPECT_EQ(logits_of(*original, prompt), logits_of(*g.model, prompt));

  const std::string q = dir / "dots1-q4_k_m.gguf";
  r = run_nekton(fmt::format("quantize {} {} --type q4_k_m", dir / "dots1", q));
  ASSERT_EQ(r.code, 0) << r.out;
  GgufModel gq = load_gguf_model(q);
  EXPECT_TRUE(gq.model->layout().find("h.2.moe.up.weight").quantized);
  EXPECT_TRUE(gq.model->layout().find("h.0.mlp.up.weight").quantized);
  r = run_nekton(
      fmt::format("generate generate.model={} generate.prompt=Hello generate.max_tokens=8 "
                  "generate.temperature=0",
                  q));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Hello"), std::string::npos) << r.out;

  c.moe_first_dense_layers = 0;
  c.moe_dense_layers = {1};
  save_tiny_model(dir / "dots1-mid", c, 95, spm);
  r = run_nekton(fmt::format("export gguf {} {}", dir / "dots1-mid", dir / "mid.gguf"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("moe_dense_layers = 1"), std::string::npos) << r.out;
  c = model_preset("dots1-tiny");  // grouped-query attention: 2 key/value heads
  c.vocab_size = 416;
  save_tiny_model(dir / "dots1-gqa", c, 96, spm);
  r = run_nekton(fmt::format("export gguf {} {}", dir / "dots1-gqa", dir / "gqa.gguf"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("model.n_kv_head = 2"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir / "gqa.gguf"));
}

// DeepSeek's deepseek2 files read back (llama.cpp runs them in
// gguf_llama_cpp_test.cc, DeepseekLogitsAndGreedy): V2-Lite's shape (attn_q,
// no query bottleneck; softmax routing), V3's (the bottleneck; sigmoid
// routing in 4 groups with the score bias) and V3 with yarn: the
// architecture and every size back, every parameter bit for bit at f32, the
// same logits (with yarn the mscale comes back through the f32
// yarn_log_multiplier, read as its shortest decimal: within 1e-6 of their
// RMS; measured 0). Export writes kv_b split per head (DeepseekSplitAndUnsplitKvB).
TEST_F(MoeGguf, DeepseekRoundTripIsExact) {
  struct Case {
    const char* preset;
    bool yarn;
  };
  for (const Case& k : {Case{"deepseek_v2-tiny", false}, Case{"deepseek_v3-tiny", false},
                        Case{"deepseek_v3-tiny", true}}) {
    const std::string name = std::string(k.preset) + (k.yarn ? "-yarn" : "");
    SCOPED_TRACE(name);
    ModelConfig c = model_preset(k.preset);
    c.vocab_size = 416;
    c.max_seq_len = 64;
    c.init_std = 0.15;
    if (k.yarn) {
      c.rope_scaling.type = RopeScalingType::Yarn;
      c.rope_scaling.factor = 4;
      c.rope_scaling.original_max_seq_len = 16;
      c.rope_scaling.mscale = c.rope_scaling.mscale_all_dim = 0.707;
    }
    save_tiny_model(dir / name, c, 97, spm);
    const std::string gguf = dir / (name + ".gguf");
    RunResult r = run_nekton(fmt::format("export gguf {} {} --type f32", dir / name, gguf));
    ASSERT_EQ(r.code, 0) << r.out;
    auto original = load_model(dir / name, DType::F32);
    GgufModel g = load_gguf_model(gguf);
    const ModelConfig& b = g.model->config();
    EXPECT_EQ(b.arch, c.arch);
    EXPECT_EQ(b.n_kv_head, c.n_head);
    EXPECT_EQ(b.q_lora_rank, c.q_lora_rank);
    EXPECT_EQ(b.kv_lora_rank, c.kv_lora_rank);
    EXPECT_EQ(b.head_dim(), c.head_dim());
    EXPECT_EQ(b.qk_rope_head_dim, c.qk_rope_head_dim);
    EXPECT_EQ(b.v_head_dim, c.v_head_dim);
    EXPECT_EQ(b.moe_first_dense_layers, c.moe_first_dense_layers);
    EXPECT_EQ(b.moe_shared_d_ff, c.moe_shared_d_ff);
    EXPECT_EQ(b.moe_score_func, c.moe_score_func);
    EXPECT_EQ(b.has_score_bias(), c.has_score_bias());
    EXPECT_EQ(b.moe_n_group, c.moe_n_group);
    EXPECT_EQ(b.norm_topk_prob, c.norm_topk_prob);
    EXPECT_DOUBLE_EQ(b.moe_routed_scaling, c.moe_routed_scaling);
    EXPECT_EQ(b.rope_scaling.type, c.rope_scaling.type);
    EXPECT_NEAR(b.rope_scaling.mscale_all_dim, c.rope_scaling.mscale_all_dim, 1e-6);
    EXPECT_NEAR(b.rope_scaling.mscale, c.rope_scaling.mscale, 1e-6);
    for (const ParamInfo& p : original->layout().params()) {
      Tensor x = original->param_f32(p), y = g.model->param_f32(g.model->layout().find(p.name));
      ASSERT_EQ(0, std::memcmp(x.raw(), y.raw(), x.nbytes())) << p.name;
    }
    const std::vector<float> want = logits_of(*original, prompt), got = logits_of(*g.model, prompt);
    if (k.yarn)
      EXPECT_LE(test::rel_max_diff(got, want), 1e-6);
    else
      EXPECT_EQ(got, want);
  }
}

// A copy of GGUF `in` as `out`: u32 keys set (or, at -1, removed), tensors
// dropped, f32 tensors added; every other key and tensor as it was (the
// tensors re-encoded in their type: exact for f32).
struct GgufEdit {
  std::map<std::string, int64_t> u32;
  std::vector<std::string> drop;
  std::vector<std::tuple<std::string, Shape, std::vector<float>>> add;
};
void rewrite_gguf(const std::string& in, const std::string& out, const GgufEdit& e) {
  std::unique_ptr<GgufFile> f = GgufFile::open(in);
  GgufWriter w;
  for (const GgufFile::RawKv& kv : f->raw_metadata())
    if (!e.u32.count(kv.key)) w.add_raw(kv.key, kv.type, kv.bytes);
  for (const auto& [key, v] : e.u32)
    if (v >= 0) w.add_u32(key, uint32_t(v));
  for (const GgufFile::TensorInfo& t : f->tensors()) {
    if (std::find(e.drop.begin(), e.drop.end(), t.name) != e.drop.end()) continue;
    const GgufFile::TensorInfo* src = &t;
    w.add_tensor(t.name, t.shape, GgmlType(t.type), [src](std::vector<float>& v) {
      const int64_t in = src->shape.back(), rows = shape_numel(src->shape) / in;
      v.resize(size_t(rows * in));
      gguf_decode_rows(*src, 0, rows, v.data());
    });
  }
  for (const auto& [name, shape, values] : e.add)
    w.add_tensor(name, shape, GgmlType::F32, [values](std::vector<float>& v) { v = values; });
  w.write(out);
}

// Every parameter of b equals a's, bit for bit.
void expect_same_params(const Transformer& a, const Transformer& b, const std::string& what) {
  for (const ParamInfo& p : a.layout().params()) {
    Tensor x = a.param_f32(p), y = b.param_f32(b.layout().find(p.name));
    ASSERT_EQ(0, std::memcmp(x.raw(), y.raw(), x.nbytes())) << what << ": " << p.name;
  }
}

// llama.cpp's deepseek2 kv_b layouts (its src/models/deepseek2.cpp and
// converter): with attention.key_length_mla the absorbed path's attn_k_b
// [H, kv_rank, nope] (each head's nope rows of kv_b transposed) and
// attn_v_b [H, v, kv_rank], one key/value head of key_length kv_rank +
// rope and value_length kv_rank (what export writes, checked value by
// value against kv_b); without it the older unsplit attn_kv_b [H (nope +
// v), kv_rank] and key_length nope + rope. Both import to the same model
// bit for bit (the saved one), with the same logits; a file holding both
// layouts reads the one its metadata names; a q8_0 file (attn_k_b's rows of
// 24 fall back to f16, attn_v_b q8_0) loads kv_b dense, exactly the decoded
// file values. Wrong shapes, a latent key_length that is not the row's and
// split tensors without key_length_mla are refused naming the tensor or key.
TEST_F(MoeGguf, DeepseekSplitAndUnsplitKvB) {
  for (const char* preset : {"deepseek_v2-tiny", "deepseek_v3-tiny"}) {
    SCOPED_TRACE(preset);
    ModelConfig c = model_preset(preset);
    c.vocab_size = 416;
    c.max_seq_len = 64;
    c.init_std = 0.15;
    const std::string name = preset, model_dir = dir / name;
    save_tiny_model(model_dir, c, 99, spm);
    const std::string split = dir / (name + "-split.gguf");
    RunResult r = run_nekton(fmt::format("export gguf {} {} --type f32", model_dir, split));
    ASSERT_EQ(r.code, 0) << r.out;
    auto original = load_model(model_dir, DType::F32);
    const int64_t H = c.n_head, nope = c.head_dim() - c.qk_rope_head_dim, v = c.v_head_dim,
                  R = c.kv_lora_rank;
    {
      auto f = GgufFile::open(split);
      EXPECT_EQ(f->get_int("deepseek2.attention.head_count_kv"), 1);
      EXPECT_EQ(f->get_int("deepseek2.attention.key_length"), R + c.qk_rope_head_dim);
      EXPECT_EQ(f->get_int("deepseek2.attention.value_length"), R);
      EXPECT_EQ(f->get_int("deepseek2.attention.key_length_mla"), c.head_dim());
      EXPECT_EQ(f->get_int("deepseek2.attention.value_length_mla"), v);
      EXPECT_EQ(f->find("blk.0.attn_kv_b.weight"), nullptr);
      for (int64_t l = 0; l < c.n_layer; ++l) {
        const GgufFile::TensorInfo& kb = f->tensor(fmt::format("blk.{}.attn_k_b.weight", l));
        const GgufFile::TensorInfo& vb = f->tensor(fmt::format("blk.{}.attn_v_b.weight", l));
        ASSERT_EQ(kb.shape, (Shape{H, R, nope}));
        ASSERT_EQ(vb.shape, (Shape{H, v, R}));
        std::vector<float> k(size_t(H * R * nope)), vv(size_t(H * v * R));
        gguf_decode_rows(kb, 0, H * R, k.data());
        gguf_decode_rows(vb, 0, H * v, vv.data());
        Tensor kv =
            original->param_f32(original->layout().find(fmt::format("h.{}.attn.kv_b.weight", l)));
        const float* w = kv.data<float>();  // [H (nope + v), R]
        for (int64_t h = 0; h < H; ++h)
          for (int64_t j = 0; j < R; ++j) {
            for (int64_t i = 0; i < nope; ++i)
              ASSERT_EQ(k[size_t((h * R + j) * nope + i)], w[(h * (nope + v) + i) * R + j]);
            for (int64_t i = 0; i < v; ++i)
              ASSERT_EQ(vv[size_t((h * v + i) * R + j)], w[(h * (nope + v) + nope + i) * R + j]);
          }
      }
    }
    // The older layout of the same model: kv_b whole, the per-head sizes as key_length.
    GgufEdit old;
    old.u32 = {{"deepseek2.attention.key_length", c.head_dim()},
               {"deepseek2.attention.value_length", v},
               {"deepseek2.attention.key_length_mla", -1},
               {"deepseek2.attention.value_length_mla", -1},
               {"deepseek2.attention.head_count_kv", H}};
    GgufEdit both;  // the split file with a stray (zero) attn_kv_b per layer
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string b = fmt::format("blk.{}.", l);
      old.drop.push_back(b + "attn_k_b.weight");
      old.drop.push_back(b + "attn_v_b.weight");
      Tensor kv =
          original->param_f32(original->layout().find(fmt::format("h.{}.attn.kv_b.weight", l)));
      old.add.emplace_back(b + "attn_kv_b.weight", kv.shape(),
                           std::vector<float>(kv.data<float>(), kv.data<float>() + kv.numel()));
      both.add.emplace_back(b + "attn_kv_b.weight", kv.shape(),
                            std::vector<float>(size_t(kv.numel()), 0.f));
    }
    const std::string unsplit = dir / (name + "-unsplit.gguf"), two = dir / (name + "-both.gguf");
    rewrite_gguf(split, unsplit, old);
    rewrite_gguf(split, two, both);
    GgufModel a = load_gguf_model(split), b = load_gguf_model(unsplit), ab = load_gguf_model(two);
    expect_same_params(*original, *a.model, "split");
    expect_same_params(*original, *b.model, "unsplit");
    expect_same_params(*original, *ab.model, "both (split metadata)");
    EXPECT_EQ(logits_of(*a.model, prompt), logits_of(*b.model, prompt));
    EXPECT_EQ(logits_of(*a.model, prompt), logits_of(*original, prompt));

    // q8_0: kv_b dense, the decoded k_b transposed and v_b.
    const std::string q8 = dir / (name + "-q8.gguf");
    r = run_nekton(fmt::format("export gguf {} {} --type q8_0", model_dir, q8));
    ASSERT_EQ(r.code, 0) << r.out;
    {
      auto f = GgufFile::open(q8);
      const GgufFile::TensorInfo &kb = f->tensor("blk.1.attn_k_b.weight"),
                                 &vb = f->tensor("blk.1.attn_v_b.weight");
      EXPECT_EQ(GgmlType(kb.type), GgmlType::F16);
      EXPECT_EQ(GgmlType(vb.type), GgmlType::Q8_0);
      std::vector<float> k(size_t(H * R * nope)), vv(size_t(H * v * R));
      gguf_decode_rows(kb, 0, H * R, k.data());
      gguf_decode_rows(vb, 0, H * v, vv.data());
      GgufModel g = load_gguf_model(q8);
      EXPECT_FALSE(g.model->layout().find("h.1.attn.kv_b.weight").quantized);
      EXPECT_TRUE(g.model->layout().find("h.1.attn.kv_a.weight").quantized);
      Tensor kv = g.model->param_f32(g.model->layout().find("h.1.attn.kv_b.weight"));
      const float* w = kv.data<float>();
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < R; ++j) {
          for (int64_t i = 0; i < nope; ++i)
            ASSERT_EQ(k[size_t((h * R + j) * nope + i)], w[(h * (nope + v) + i) * R + j]);
          for (int64_t i = 0; i < v; ++i)
            ASSERT_EQ(vv[size_t((h * v + i) * R + j)], w[(h * (nope + v) + nope + i) * R + j]);
        }
      // Printed, not asserted: the q8_0 rounding of the other matrices flips
      // the tiny random models' top-k routing (measured 0.30 for V2, 1.14
      // for V3), so no tolerance against the f32 model says anything of the
      // split layout, which the exact kv_b comparison above checks.
      const double d =
          test::rel_max_diff(logits_of(*g.model, prompt), logits_of(*original, prompt));
      std::printf("[%s q8_0 split kv_b] logits within %.3g of the f32 model's (rel. RMS)\n", preset,
                  d);
    }

    // Refusals.
    auto refused = [&](const GgufEdit& e, const std::string& file) {
      rewrite_gguf(split, dir / file, e);
      return error_of([&] { load_gguf_model(dir / file); });
    };
    GgufEdit bad;
    bad.drop = {"blk.1.attn_k_b.weight"};
    bad.add.emplace_back("blk.1.attn_k_b.weight", Shape{H, nope, R},
                         std::vector<float>(size_t(H * nope * R), 0.f));  // not transposed
    std::string e = refused(bad, "bad_kb.gguf");
    EXPECT_NE(e.find(fmt::format("tensor 'blk.1.attn_k_b.weight' has shape [{}, {}, {}], expected "
                                 "[{}, {}, {}]",
                                 H, nope, R, H, R, nope)),
              std::string::npos)
        << e;
    bad.drop = {"blk.2.attn_v_b.weight"};
    bad.add = {
        {"blk.2.attn_v_b.weight", Shape{H, v + 1, R}, std::vector<float>(size_t(H * (v + 1) * R))}};
    e = refused(bad, "bad_vb.gguf");
    EXPECT_NE(e.find("tensor 'blk.2.attn_v_b.weight' has shape"), std::string::npos) << e;
    GgufEdit key;
    key.u32 = {{"deepseek2.attention.key_length", c.head_dim()}};
    e = refused(key, "bad_key.gguf");
    EXPECT_NE(e.find(fmt::format("deepseek2.attention.key_length = {}; with "
                                 "attention.key_length_mla it is the latent row's size, {}",
                                 c.head_dim(), R + c.qk_rope_head_dim)),
              std::string::npos)
        << e;
    GgufEdit nomla;
    nomla.u32 = {{"deepseek2.attention.key_length_mla", -1},
                 {"deepseek2.attention.value_length_mla", -1}};
    e = refused(nomla, "no_mla.gguf");
    EXPECT_NE(e.find("tensor 'blk.0.attn_k_b.weight' without 'blk.0.attn_kv_b.weight'"),
              std::string::npos)
        << e;
  }
}

// GLM-4.5 in llama.cpp's glm4moe layout: the rotated values per head
// (rope.dimension_count, half the head), the head size (key_length), q/k/v
// biases, q/k norms, the pre-MLP norm as post_attention_norm, the routing
// as dots1's; the f32 file imports back bit for bit with the partial rotary
// factor and q/k norms as they were (also without q/k norms).
TEST_F(MoeGguf, Glm4MoeLayoutRoundTrip) {
  for (bool qk_norm : {true, false}) {
    SCOPED_TRACE(qk_norm);
    ModelConfig c = model_preset("glm4_moe-tiny");
    c.vocab_size = 416;
    c.max_seq_len = 64;
    c.qk_norm = qk_norm;
    c.init_std = 0.05;
    const std::string name = fmt::format("glm{}", int(qk_norm));
    save_tiny_model(dir / name, c, 98, spm);
    const std::string gguf = dir / (name + ".gguf");
    RunResult r = run_nekton(fmt::format("export gguf {} {} --type f32", dir / name, gguf));
    ASSERT_EQ(r.code, 0) << r.out;
    auto f = GgufFile::open(gguf);
    EXPECT_EQ(f->get_string("general.architecture"), "glm4moe");
    EXPECT_EQ(f->get_int("glm4moe.rope.dimension_count"), 16);
    EXPECT_EQ(f->get_int("glm4moe.attention.key_length"), 32);
    EXPECT_EQ(f->get_int("glm4moe.leading_dense_block_count"), 1);
    EXPECT_EQ(f->get_int("glm4moe.expert_gating_func"), 2);
    EXPECT_EQ(f->get_int("glm4moe.expert_shared_count"), 1);
    EXPECT_EQ(f->tensor("blk.0.attn_k.bias").shape, (Shape{64}));
    EXPECT_EQ(f->tensor("blk.1.post_attention_norm.weight").shape, (Shape{64}));
    EXPECT_EQ(f->find("blk.1.ffn_norm.weight"), nullptr);
    EXPECT_EQ(f->find("blk.0.attn_q_norm.weight") != nullptr, qk_norm);
    EXPECT_EQ(f->tensor("blk.1.exp_probs_b.bias").shape, (Shape{8}));
    auto original = load_model(dir / name, DType::F32);
    GgufModel g = load_gguf_model(gguf);
    EXPECT_EQ(g.model->config().rotary_dim(), 16);
    EXPECT_EQ(g.model->config().qk_norm, qk_norm);
    for (const ParamInfo& p : original->layout().params()) {
      Tensor x = original->param_f32(p), y = g.model->param_f32(g.model->layout().find(p.name));
      ASSERT_EQ(0, std::memcmp(x.raw(), y.raw(), x.nbytes())) << p.name;
    }
    EXPECT_EQ(logits_of(*original, prompt), logits_of(*g.model, prompt));
  }
}

}  // namespace
}  // namespace nk
