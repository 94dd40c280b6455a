// Mixture-of-Experts GGUF exports run in llama.cpp itself (Mixtral, Qwen2/3-MoE,
// dots.llm1, GLM-4.5, DeepSeek-V2/V3): llama.cpp's logits and greedy tokens
// against Nekton's on the same weights (tests/ckpt/llama_cpp_test_util.h).
#include "llama_cpp_test_util.h"

namespace nk {
namespace {

using namespace test;

// Mixtral as llama.cpp runs it: its "llama" graph with llama.expert_count
// and expert_used_count, the router ffn_gate_inp and the experts stacked in
// ffn_{gate,up,down}_exps. 8 experts, top-2 (Mixtral's), over the Llama
// test's tiny shape: logits at every prompt position within the Llama
// test's tolerances (f32: the same arithmetic up to order; f16: llama.cpp
// rounds activations to f16) and the same greedy continuation. The f32 file
// imported back computes the exported model's logits exactly; a q4_k_m file
// (Mixtral's recipe: experts q4_k, ffn_down_exps q6_k in the more-bits
// layers, attn_k and attn_v q8_0) imported with its blocks kept decodes
// through the Generator as llama.cpp does, up to a near-tie (as
// ImportedGgufAgreesWithLlamaCpp; tolerance q4_0's and q4_k_m's there).
TEST_F(LlamaCpp, MixtralLogitsAndGreedy) {
  TempDir dir("gguf_mixtral");
  std::string spm = train_small_spm(dir, 400);
  std::vector<int32_t> prompt =
      spm_prompt(spm, "The quick brown fox jumps over the lazy dog by the river in spring.");
  ModelConfig c = model_preset("mixtral-tiny");
  c.vocab_size = 416;
  c.max_seq_len = 64;
  c.num_experts = 8;
  c.d_ff = c.moe_d_ff = 96;
  c.init_std = 0.15;
  std::string model_dir = dir / "model";
  save_tiny_model(model_dir, c, 61, spm);
  expect_llama_cpp_agrees(dir, model_dir, "mixtral-f16", prompt, GgmlType::F16, 2e-2);
  auto want = expect_llama_cpp_agrees(dir, model_dir, "mixtral-f32", prompt, GgmlType::F32, 1e-4);
  GgufModel back = load_gguf_model(dir / "mixtral-f32.gguf");
  EXPECT_EQ(back.model->config().arch, "mixtral");
  EXPECT_EQ(back.model->config().num_experts, 8);
  EXPECT_EQ(back.model->config().num_experts_per_tok, 2);
  EXPECT_EQ(nekton_logits(*back.model, prompt), want);

  // Rows of 256 for the block types.
  c.d_model = 256;
  c.d_ff = c.moe_d_ff = 256;
  c.init_std = 0.08;
  save_tiny_model(dir / "q", c, 62, spm);
  const std::string gguf = dir / "mixtral-q4_k_m.gguf";
  RunResult r = run_nekton(fmt::format("quantize {} {} --type q4_k_m", dir / "q", gguf));
  ASSERT_EQ(r.code, 0) << r.out;
  GgufModel g = load_gguf_model(gguf);
  const int64_t n_gen = 12;
  LlamaCppRun lc = run_llama_cpp(gguf, prompt, n_gen, "");
  ASSERT_EQ(lc.greedy.size(), size_t(n_gen));
  const std::vector<int32_t> greedy = generator_greedy(*g.model, prompt, n_gen);
  ASSERT_EQ(greedy.size(), size_t(n_gen));
  std::vector<int32_t> forced = prompt;
  forced.insert(forced.end(), lc.greedy.begin(), lc.greedy.end() - 1);
  auto along = nekton_logits(*g.model, forced);
  const double tol = 0.1 * rms(along);
  bool within = true;
  int64_t fork = n_gen;
  for (int64_t i = 0; i < n_gen; ++i) {
    const auto& row = along[prompt.size() - 1 + size_t(i)];
    const float best = row[size_t(argmax(row))];
    within &= row[size_t(lc.greedy[size_t(i)])] >= best - tol;
    if (fork == n_gen && greedy[size_t(i)] != lc.greedy[size_t(i)]) {
      fork = i;
      EXPECT_GE(row[size_t(greedy[size_t(i)])], best - tol) << "step " << i << ": not a near-tie";
    }
  }
  std::cout << fmt::format(
      "[llama.cpp vs imported mixtral q4_k_m] greedy continuations of {} tokens equal for {} "
      "tokens; llama.cpp's tokens within {:.3g} of the imported model's best logit: {}\n",
      n_gen, fork, tol, within);
  EXPECT_TRUE(within);
}

// llama.cpp's qwen3 graph (dense): no biases, RMSNorms over each head of q
// and k before the NEOX rotation, a head size (qwen3.attention.key_length)
// apart from d_model / n_head; and its qwen3moe and qwen2moe graphs: the
// router ffn_gate_inp, the experts stacked in ffn_{gate,up,down}_exps, the
// top-k renormalised (qwen3moe) or not (qwen2moe), and Qwen2-MoE's shared
// expert ffn_{gate,up,down}_shexp behind the sigmoid of ffn_gate_inp_shexp.
// Logits at every prompt position within the Llama test's tolerances (f32:
// same arithmetic up to order; f16: llama.cpp rounds activations to f16)
// and the same greedy continuation; the f32 files imported back compute
// the exported models' logits exactly.
TEST_F(LlamaCpp, QwenMoeAndQwen3LogitsAndGreedy) {
  TempDir dir("gguf_qwen_moe");
  std::string spm = train_small_spm(dir, 400);
  std::vector<int32_t> prompt =
      spm_prompt(spm, "The quick brown fox jumps over the lazy dog by the river in spring.");
  struct Case {
    const char* preset;
    bool tied;
    uint64_t seed;
  };
  for (const Case& k : {Case{"qwen3-tiny", true, 81}, Case{"qwen3-moe-tiny", false, 82},
                        Case{"qwen2-moe-tiny", false, 83}, Case{"qwen3-moe-tiny", true, 84}}) {
    SCOPED_TRACE(k.preset);
    ModelConfig c = model_preset(k.preset);
    c.vocab_size = 416;
    c.max_seq_len = 64;
    c.tied_embeddings = k.tied;
    c.init_std = 0.15;
    const std::string name = fmt::format("{}-{}", k.preset, k.tied ? "tied" : "untied");
    const std::string model_dir = dir / name;
    save_tiny_model(model_dir, c, k.seed, spm);
    expect_llama_cpp_agrees(dir, model_dir, name + "-f16", prompt, GgmlType::F16, 2e-2);
    auto want = expect_llama_cpp_agrees(dir, model_dir, name + "-f32", prompt, GgmlType::F32, 1e-4);
    GgufModel back = load_gguf_model(dir / (name + "-f32.gguf"));
    EXPECT_EQ(back.model->config().arch, c.arch);
    EXPECT_EQ(back.model->config().head_dim(), c.head_dim());
    EXPECT_EQ(back.model->config().moe_shared_d_ff, c.moe_shared_d_ff);
    EXPECT_EQ(nekton_logits(*back.model, prompt), want);
  }
}

// llama.cpp's dots1 graph: Qwen3's attention, a leading dense layer, then
// DeepSeek-V3's routing from the metadata (sigmoid gating, the score bias
// exp_probs_b.bias choosing, the top-k renormalised and scaled by
// expert_weights_scale) and an ungated shared expert; ungrouped and with
// 4 groups of 2 (expert_group_count, expert_group_used_count). As many
// key/value heads as query heads (llama.cpp's dots1 sizes attn_k and attn_v
// so; export refuses others). Tolerances as the Qwen ones'.
TEST_F(LlamaCpp, Dots1LogitsAndGreedy) {
  TempDir dir("gguf_dots1");
  std::string spm = train_small_spm(dir, 400);
  std::vector<int32_t> prompt =
      spm_prompt(spm, "The quick brown fox jumps over the lazy dog by the river in spring.");
  for (int64_t groups : {1, 4}) {
    SCOPED_TRACE(groups);
    ModelConfig c = model_preset("dots1-tiny");
    c.vocab_size = 416;
    c.max_seq_len = 64;
    c.moe_n_group = groups;
    c.moe_topk_group = groups == 1 ? 1 : 2;
    c.n_kv_head = c.n_head;  // llama.cpp's dots1 has no grouped-query attention
    c.init_std = 0.15;
    const std::string name = fmt::format("dots1-g{}", groups);
    const std::string model_dir = dir / name;
    save_tiny_model(model_dir, c, 85 + uint64_t(groups), spm);
    expect_llama_cpp_agrees(dir, model_dir, name + "-f16", prompt, GgmlType::F16, 2e-2);
    auto want = expect_llama_cpp_agrees(dir, model_dir, name + "-f32", prompt, GgmlType::F32, 1e-4);
    GgufModel back = load_gguf_model(dir / (name + "-f32.gguf"));
    const ModelConfig& b = back.model->config();
    EXPECT_EQ(b.arch, "dots1");
    EXPECT_EQ(b.moe_first_dense_layers, 1);
    EXPECT_EQ(b.moe_n_group, groups);
    EXPECT_EQ(b.moe_shared_d_ff, c.moe_shared_d_ff);
    EXPECT_DOUBLE_EQ(b.moe_routed_scaling, 2.5);
    EXPECT_TRUE(b.has_score_bias());
    EXPECT_EQ(nekton_logits(*back.model, prompt), want);
  }
}

// llama.cpp's glm4moe graph (GLM-4.5): q/k/v biases, the optional q/k norms
// (attn_q_norm present: GLM-4.5; absent: GLM-4.5-Air), NEOX RoPE over the
// first rope.dimension_count values of each head (partial rotary, half), the
// pre-MLP norm as post_attention_norm, a leading dense layer, then
// DeepSeek-V3's routing from the metadata and an ungated shared expert;
// with grouped-query attention, ungrouped and with 4 groups of 2, tied and
// untied heads. Tolerances as the Qwen ones' (f32 1e-4, f16 2e-2 absolute
// on the logits); the greedy tokens equal.
TEST_F(LlamaCpp, Glm4MoeLogitsAndGreedy) {
  TempDir dir("gguf_glm4_moe");
  std::string spm = train_small_spm(dir, 400);
  std::vector<int32_t> prompt =
      spm_prompt(spm, "The quick brown fox jumps over the lazy dog by the river in spring.");
  struct Case {
    bool qk_norm;
    int64_t groups;
    bool tied;
  };
  for (const Case& k : {Case{true, 4, false}, Case{false, 1, false}, Case{true, 1, true}}) {
    const std::string name =
        fmt::format("glm-qk{}-g{}-{}", int(k.qk_norm), k.groups, k.tied ? "tied" : "untied");
    SCOPED_TRACE(name);
    ModelConfig c = model_preset("glm4_moe-tiny");
    c.vocab_size = 416;
    c.max_seq_len = 64;
    c.qk_norm = k.qk_norm;
    c.moe_n_group = k.groups;
    c.moe_topk_group = k.groups == 1 ? 1 : 2;
    c.tied_embeddings = k.tied;
    c.init_std = 0.15;
    const std::string model_dir = dir / name;
    save_tiny_model(model_dir, c, 97 + uint64_t(k.groups) + (k.qk_norm ? 10 : 0), spm);
    expect_llama_cpp_agrees(dir, model_dir, name + "-f16", prompt, GgmlType::F16, 2e-2);
    auto want = expect_llama_cpp_agrees(dir, model_dir, name + "-f32", prompt, GgmlType::F32, 1e-4);
    GgufModel back = load_gguf_model(dir / (name + "-f32.gguf"));
    const ModelConfig& b = back.model->config();
    EXPECT_EQ(b.arch, "glm4_moe");
    EXPECT_EQ(b.rotary_dim(), c.rotary_dim());
    EXPECT_EQ(b.qk_norm, k.qk_norm);
    EXPECT_EQ(b.moe_n_group, k.groups);
    EXPECT_EQ(b.moe_shared_d_ff, c.moe_shared_d_ff);
    EXPECT_EQ(nekton_logits(*back.model, prompt), want);
  }
}

// llama.cpp's deepseek2 graph: Multi-head Latent Attention (V3: attn_q_a,
// attn_q_a_norm, attn_q_b; V2-Lite: attn_q, with attention.q_lora_rank 0;
// attn_kv_a_mqa, attn_kv_a_norm, kv_b split per head as attn_k_b / attn_v_b
// with attention.key_length_mla, which llama.cpp runs as its absorbed MLA
// over a cache of latent rows, as its converter writes them; RoPE on the rotary
// part as interleaved pairs), a leading dense layer, then the routing from
// the metadata (V3: sigmoid, score bias, groups, renormalised and scaled; V2:
// softmax, unnormalised) and the shared experts; V3 with plain RoPE and with
// yarn (the scores' mscale through rope.scaling.yarn_log_multiplier).
// Tolerances as the Qwen ones'. The f32 files llama.cpp ran, imported
// (ckpt/gguf_import.h), give Nekton's logits (within 1e-6 of their RMS: the
// yarn mscale comes back through an f32 key) and, decoding through the
// Generator over the latent KV cache, the greedy tokens llama.cpp gave.
TEST_F(LlamaCpp, DeepseekLogitsAndGreedy) {
  TempDir dir("gguf_deepseek");
  std::string spm = train_small_spm(dir, 400);
  std::vector<int32_t> prompt =
      spm_prompt(spm, "The quick brown fox jumps over the lazy dog by the river in spring.");
  struct Case {
    const char* preset;
    bool yarn;
    const char* name;
  };
  for (const Case& k :
       {Case{"deepseek_v2-tiny", false, "deepseek2"}, Case{"deepseek_v3-tiny", false, "deepseek3"},
        Case{"deepseek_v3-tiny", true, "deepseek3-yarn"}}) {
    SCOPED_TRACE(k.name);
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
    const std::string model_dir = dir / k.name;
    save_tiny_model(model_dir, c, k.yarn ? 91 : 92, spm);
    expect_llama_cpp_agrees(dir, model_dir, std::string(k.name) + "-f16", prompt, GgmlType::F16,
                            2e-2);
    auto want = expect_llama_cpp_agrees(dir, model_dir, std::string(k.name) + "-f32", prompt,
                                        GgmlType::F32, 1e-4);
    GgufModel back = load_gguf_model(dir / (std::string(k.name) + "-f32.gguf"));
    EXPECT_EQ(back.model->config().arch, c.arch);
    const Compared same = compare_logits(want, nekton_logits(*back.model, prompt), 0);
    EXPECT_LE(same.max_abs, 1e-6 * rms(want)) << k.name;
    EXPECT_EQ(generator_greedy(*back.model, prompt, 8),
              nekton_greedy(*load_model(model_dir, DType::F32), prompt, 8))
        << k.name;
    std::cout << fmt::format("[{} imported from the f32 GGUF] max |logit diff| {:.3g}\n", k.name,
                             same.max_abs);
  }
}

}  // namespace
}  // namespace nk
