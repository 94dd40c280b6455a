// GLM-4.5 family (Zhipu's GLM-4.5, GLM-4.5-Air, GLM-4.6; Hugging Face's
// Glm4MoeForCausalLM, model_type glm4_moe): Llama's block with biases on the
// q, k and v projections (attention_bias, true in every published model; the
// output projection has none), per-head RMSNorms on q and k before the
// rotation when use_qk_norm (GLM-4.5: yes, GLM-4.5-Air: no; ModelConfig::
// qk_norm), a head size of its own (head_dim 128 over hidden 4096 and 96
// heads), and partial rotary: RoPE turns the first int(head_dim x
// partial_rotary_factor) values of each head (0.5, HF's default), rotate-half
// over those (transformers takes GPT-NeoX's apply_rotary_pos_emb), the rest
// pass through (ModelConfig::partial_rotary_factor). The MLPs are
// DeepSeek-V3's, as dots.llm1's: the first first_k_dense_replace layers
// (default 1) a dense SwiGLU MLP of intermediate_size, the others
// n_routed_experts SwiGLU experts of moe_intermediate_size scored by
// sigmoid(router x), each token's top num_experts_per_tok chosen from its
// topk_group best of n_group groups on the scores plus
// e_score_correction_bias, weighted by the unbiased scores (renormalised
// when norm_topk_prob, HF's default true) times routed_scaling_factor, plus
// an ungated shared expert of n_shared_experts x moe_intermediate_size.
//
// Multi-token prediction: GLM-4.5's checkpoints hold
// num_nextn_predict_layers extra layers after num_hidden_layers (model.
// layers.46.* in GLM-4.5-Air) that transformers does not load; import leaves
// them out with a logged note (as llama.cpp runs past them), export writes
// none (num_nextn_predict_layers 0).
//
// In GGUF it is llama.cpp's "glm4moe": Llama's attention tensors with
// attn_{q,k,v}.bias, the optional attn_q_norm / attn_k_norm, the
// post-attention norm as blk.L.post_attention_norm, the dense layers'
// ffn_{gate,up,down}, the MoE layers' router, stacked experts,
// exp_probs_b.bias and ffn_*_shexp, the routing in the metadata
// (Architecture::gguf_deepseek_routing) and the rotated values as
// rope.dimension_count (NEOX rotation: q and k rows as they are).
#include "core/limits.h"
#include "core/log.h"
#include "model/arch.h"

namespace nk {
namespace {

class Glm4Moe final : public Architecture {
 public:
  std::string name() const override { return "glm4_moe"; }
  std::string display_name() const override { return "GLM-4.5"; }
  BlockSpec block() const override {
    BlockSpec s;
    s.rms_norm = true;
    s.swiglu = true;
    s.qkv_bias = true;
    return s;  // q/k norms per model: optional_qk_norm
  }
  bool moe() const override { return true; }
  bool optional_qk_norm() const override { return true; }
  bool partial_rotary() const override { return true; }

  void add_presets(std::map<std::string, ModelConfig>& r) const override {
    ModelConfig c;
    c.arch = "glm4_moe";
    c.norm_eps = 1e-5;
    c.rope_theta = 1e6;
    c.partial_rotary_factor = 0.5;
    c.qk_norm = true;
    c.tied_embeddings = false;
    c.moe_score_func = "sigmoid";
    c.moe_score_bias = true;
    c.norm_topk_prob = true;
    c.moe_aux_loss_coeff = 0.0;
    // For tests, over bytes: heads of 32 (4 x 32 = 128 against d_model 64,
    // as GLM-4.5's differ), half of each rotated; a dense first layer, then
    // eight experts of 32 units in four groups (each token's 2 from its best
    // 2 groups), scaled by 2.5, and one shared expert.
    c.n_layer = 3;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.d_model = 64;
    c.attn_head_dim = 32;
    c.d_ff = 128;
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    c.moe_d_ff = 32;
    c.moe_shared_d_ff = 32;
    c.moe_n_group = 4;
    c.moe_topk_group = 2;
    c.moe_routed_scaling = 2.5;
    c.moe_first_dense_layers = 1;
    c.vocab_size = 257;
    c.max_seq_len = 256;
    r["glm4_moe-tiny"] = c;
  }

  void validate(const ModelConfig& c, const std::string& p) const override {
    validate_deepseek_moe(c, p, "GLM-4.5");
  }

  std::vector<std::pair<std::string, std::string>> hf_classes() const override {
    return {{"Glm4MoeForCausalLM", "glm4_moe"}};
  }

  void hf_read_config(const HfConfigReader& h, ModelConfig& c) const override {
    hf_read_llama_style(h, c, /*any_head_dim=*/true);
    c.norm_eps = h.number("rms_norm_eps", 1e-5);  // Glm4MoeConfig's default
    if (!h.boolean("attention_bias", false))
      h.unsupported("attention_bias",
                    "q, k and v projections with biases only (true, as GLM-4.5 is published)");
    c.partial_rotary_factor = h.number("partial_rotary_factor", 0.5);
    c.qk_norm = h.boolean("use_qk_norm", false);
    // Glm4MoeConfig's defaults: one shared expert, one group, renormalised
    // weights, one leading dense layer.
    hf_read_deepseek_moe(h, c, DeepseekMoeDefaults{1, 1, true, 1});
    const int64_t mtp = h.integer("num_nextn_predict_layers", 0);
    if (mtp < 0) h.fail_at(fmt::format("'num_nextn_predict_layers' = {} must be 0 or more", mtp));
    if (mtp > 0)
      NK_INFO(
          "{}: num_nextn_predict_layers = {}: the multi-token-prediction layers after layer {} "
          "are left out (Nekton, as transformers and llama.cpp, runs the {} others)",
          h.where(), mtp, c.n_layer - 1, c.n_layer);
  }

  void hf_write_config(const ModelConfig& c, nlohmann::ordered_json& j) const override {
    hf_check_deepseek_moe(c, "Glm4MoeConfig");
    hf_write_llama_style(c, j);
    j["partial_rotary_factor"] = c.partial_rotary_factor;
    j["attention_bias"] = true;
    j["attention_dropout"] = 0.0;
    j["use_qk_norm"] = c.qk_norm;
    hf_write_deepseek_moe(c, j);
    j["num_nextn_predict_layers"] = 0;
  }

  // Llama's names with Qwen2's q/k/v biases (and Qwen3's q/k norms when the
  // model has them); each MoE layer's DeepSeek-V3 block after its
  // post-attention norm.
  std::vector<ExternalTensor> hf_tensors(const ModelConfig& c, const std::string&) const override {
    return deepseek_moe_hf_tensors(c, llama_style_hf_tensors(c, true, c.qk_norm));
  }
  bool hf_skipped_tensor(const ModelConfig& c, const std::string& name) const override {
    // model.layers.L.* with L >= num_hidden_layers: a multi-token-prediction layer.
    const std::string pre = "model.layers.";
    if (!name.starts_with(pre)) return false;
    const size_t dot = name.find('.', pre.size());
    const std::string l = name.substr(pre.size(), dot == std::string::npos ? 0 : dot - pre.size());
    if (l.empty() || l.find_first_not_of("0123456789") != std::string::npos || l.size() > 6)
      return false;
    return std::stoll(l) >= c.n_layer;
  }
  DType hf_default_dtype() const override { return DType::BF16; }  // as GLM-4.5 is published

  std::string gguf_arch() const override { return "glm4moe"; }
  bool gguf_expert_ff_keys() const override { return true; }
  bool gguf_deepseek_routing() const override { return true; }
  std::vector<ExternalTensor> gguf_tensors(const ModelConfig& c) const override {
    std::vector<ExternalTensor> t =
        moe_gguf_tensors(c, llama_style_gguf_tensors(c, true, false, c.qk_norm));
    // llama.cpp's glm4moe reads the pre-MLP norm as attn_post_norm.
    const std::string ffn_norm = "ffn_norm.weight";
    for (ExternalTensor& e : t)
      if (e.name.ends_with(ffn_norm))
        e.name = e.name.substr(0, e.name.size() - ffn_norm.size()) + "post_attention_norm.weight";
    return t;
  }
};

}  // namespace

const Architecture& glm4_moe_architecture() {
  static const Glm4Moe a;
  return a;
}

}  // namespace nk
