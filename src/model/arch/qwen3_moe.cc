// Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (no biases,
// per-head RMSNorms on q and k before the rotation, a head size of its own)
// with a sparse Mixture-of-Experts MLP in its MoE layers: a router without
// bias over num_experts SwiGLU experts of moe_intermediate_size, softmax
// scores, each token's top num_experts_per_tok renormalised when
// norm_topk_prob (true in the published models; Qwen3MoeConfig's default
// is false), no shared expert. Hugging Face's Qwen3MoeForCausalLM names
// them as Qwen2-MoE does (mlp.gate, mlp.experts.e.{gate,up,down}_proj);
// head_dim defaults to hidden_size / num_attention_heads. Dense layers
// (mlp_only_layers, decoder_sparse_step other than 1) have an MLP of
// intermediate_size (ModelConfig::moe_dense_layers); sliding-window
// attention is refused. In GGUF it is llama.cpp's
// "qwen3moe": Qwen3's attention tensors (attn_q_norm, attn_k_norm), the
// router ffn_gate_inp and the stacked ffn_{gate,up,down}_exps, the experts'
// width as qwen3moe.expert_feed_forward_length; llama.cpp's graph always
// renormalises the top-k (norm_topk_prob = false is refused).
#include "core/limits.h"
#include "model/arch.h"

namespace nk {
namespace {

class Qwen3Moe final : public Architecture {
 public:
  std::string name() const override { return "qwen3_moe"; }
  std::string display_name() const override { return "Qwen3-MoE"; }
  BlockSpec block() const override {
    BlockSpec s;
    s.rms_norm = true;
    s.swiglu = true;
    s.qk_norm = true;
    return s;
  }
  bool moe() const override { return true; }

  void add_presets(std::map<std::string, ModelConfig>& r) const override {
    ModelConfig c;
    c.arch = "qwen3_moe";
    c.norm_eps = 1e-6;
    c.rope_theta = 1e6;
    c.tied_embeddings = false;
    c.norm_topk_prob = true;
    c.moe_aux_loss_coeff = 0.001;
    // For tests, over bytes: eight experts of 32 units, top-2, heads of 32
    // (4 x 32 = 128 against d_model 64, as Qwen3's differ).
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.d_model = 64;
    c.attn_head_dim = 32;
    c.d_ff = 192;
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    c.moe_d_ff = 32;
    c.vocab_size = 257;
    c.max_seq_len = 256;
    r["qwen3-moe-tiny"] = c;
    // Qwen3-30B-A3B's published shape.
    c.n_layer = 48;
    c.n_head = 32;
    c.n_kv_head = 4;
    c.d_model = 2048;
    c.attn_head_dim = 128;
    c.d_ff = 6144;
    c.num_experts = 128;
    c.num_experts_per_tok = 8;
    c.moe_d_ff = 768;
    c.vocab_size = 151936;
    c.max_seq_len = 40960;
    r["qwen3-30b-a3b"] = c;
  }

  void validate(const ModelConfig& c, const std::string& p) const override {
    if (c.moe_score_func != "softmax")
      fail("{}moe_score_func: Qwen3-MoE's router scores are softmax, got '{}'", p,
           c.moe_score_func);
    if (c.moe_shared_d_ff != 0)
      fail("{}moe_shared_d_ff: Qwen3-MoE has no shared expert (got {}; model.arch=qwen2_moe has)",
           p, c.moe_shared_d_ff);
  }

  std::vector<std::pair<std::string, std::string>> hf_classes() const override {
    return {{"Qwen3MoeForCausalLM", "qwen3_moe"}};
  }

  void hf_read_config(const HfConfigReader& h, ModelConfig& c) const override {
    hf_read_llama_style(h, c, /*any_head_dim=*/true);
    hf_read_qwen_moe(h, c, /*shared_expert=*/false);
    if (h.boolean("attention_bias", false))
      h.unsupported("attention_bias", "attention projections without biases only");
  }

  void hf_write_config(const ModelConfig& c, nlohmann::ordered_json& j) const override {
    hf_write_llama_style(c, j);
    j["attention_bias"] = false;
    hf_write_qwen_moe(c, j, /*shared_expert=*/false);
  }

  std::vector<ExternalTensor> hf_tensors(const ModelConfig& c, const std::string&) const override {
    return qwen_moe_hf_tensors(c, llama_style_hf_tensors(c, false, /*qk_norm=*/true));
  }
  DType hf_default_dtype() const override { return DType::BF16; }  // as Qwen's are published

  std::string gguf_arch() const override { return "qwen3moe"; }
  bool gguf_expert_ff_keys() const override { return true; }
  std::vector<ExternalTensor> gguf_tensors(const ModelConfig& c) const override {
    return moe_gguf_tensors(c, llama_style_gguf_tensors(c, false, false, /*qk_norm=*/true));
  }
};

}  // namespace

const Architecture& qwen3_moe_architecture() {
  static const Qwen3Moe a;
  return a;
}

}  // namespace nk
