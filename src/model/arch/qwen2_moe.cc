// Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention (biases on q,
// k and v) with a sparse Mixture-of-Experts MLP in its MoE layers: a router
// without bias over num_experts SwiGLU experts of moe_intermediate_size,
// softmax scores, each token's top num_experts_per_tok (renormalised only
// when norm_topk_prob, false in the published models), plus a shared expert
// of shared_expert_intermediate_size that every token goes through, scaled
// by sigmoid(shared_expert_gate x) (nn/moe.h). Hugging Face's
// Qwen2MoeForCausalLM names them model.layers.L.mlp.gate,
// mlp.experts.e.{gate,up,down}_proj, mlp.shared_expert.{gate,up,down}_proj
// and mlp.shared_expert_gate; intermediate_size is the dense MLP's of the
// layers mlp_only_layers and decoder_sparse_step make dense
// (ModelConfig::moe_dense_layers). In GGUF it is llama.cpp's "qwen2moe": Qwen2's attention
// tensors (q/k/v biases, rows unpermuted), the router ffn_gate_inp, the
// stacked ffn_{gate,up,down}_exps, the shared expert's ffn_{gate,up,down}_shexp
// and its gate ffn_gate_inp_shexp [C] (1-d); the widths as
// expert_feed_forward_length and expert_shared_feed_forward_length.
// llama.cpp's graph never renormalises the top-k (norm_topk_prob = true is
// refused) and needs output.weight (a tied head is written there too).
#include "core/limits.h"
#include "model/arch.h"

namespace nk {
namespace {

class Qwen2Moe final : public Architecture {
 public:
  std::string name() const override { return "qwen2_moe"; }
  std::string display_name() const override { return "Qwen2-MoE"; }
  BlockSpec block() const override {
    BlockSpec s;
    s.rms_norm = true;
    s.swiglu = true;
    s.qkv_bias = true;
    return s;
  }
  bool moe() const override { return true; }

  void add_presets(std::map<std::string, ModelConfig>& r) const override {
    ModelConfig c;
    c.arch = "qwen2_moe";
    c.norm_eps = 1e-6;
    c.rope_theta = 1e6;
    c.tied_embeddings = false;
    c.norm_topk_prob = false;
    c.moe_aux_loss_coeff = 0.001;
    c.moe_shared_expert_gate = true;
    // For tests, over bytes: four experts of 32 units, top-2, a shared
    // expert of 64.
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.d_model = 64;
    c.d_ff = 176;
    c.num_experts = 4;
    c.num_experts_per_tok = 2;
    c.moe_d_ff = 32;
    c.moe_shared_d_ff = 64;
    c.vocab_size = 257;
    c.max_seq_len = 256;
    r["qwen2-moe-tiny"] = c;
    // Qwen1.5-MoE-A2.7B's published shape.
    c.n_layer = 24;
    c.n_head = 16;
    c.n_kv_head = 16;
    c.d_model = 2048;
    c.d_ff = 5632;
    c.num_experts = 60;
    c.num_experts_per_tok = 4;
    c.moe_d_ff = 1408;
    c.moe_shared_d_ff = 5632;
    c.vocab_size = 151936;
    c.max_seq_len = 8192;
    r["qwen1.5-moe-a2.7b"] = c;
  }

  void validate(const ModelConfig& c, const std::string& p) const override {
    if (c.moe_score_func != "softmax")
      fail("{}moe_score_func: Qwen2-MoE's router scores are softmax, got '{}'", p,
           c.moe_score_func);
    if (c.moe_shared_d_ff == 0 || !c.moe_shared_expert_gate)
      fail(
          "{}moe_shared_d_ff: Qwen2-MoE has a gated shared expert in every layer (got "
          "moe_shared_d_ff = {}, moe_shared_expert_gate = {})",
          p, c.moe_shared_d_ff, c.moe_shared_expert_gate);
  }

  std::vector<std::pair<std::string, std::string>> hf_classes() const override {
    return {{"Qwen2MoeForCausalLM", "qwen2_moe"}};
  }

  void hf_read_config(const HfConfigReader& h, ModelConfig& c) const override {
    hf_read_llama_style(h, c);
    hf_read_qwen_moe(h, c, /*shared_expert=*/true);
    if (h.has("qkv_bias") && !h.boolean("qkv_bias", true))
      h.unsupported("qkv_bias", "Qwen2-MoE's q, k and v projections carry biases");
  }

  void hf_write_config(const ModelConfig& c, nlohmann::ordered_json& j) const override {
    hf_write_llama_style(c, j);
    hf_write_qwen_moe(c, j, /*shared_expert=*/true);
  }

  std::vector<ExternalTensor> hf_tensors(const ModelConfig& c, const std::string&) const override {
    return qwen_moe_hf_tensors(c, llama_style_hf_tensors(c, true));
  }
  DType hf_default_dtype() const override { return DType::BF16; }  // as Qwen's are published

  std::string gguf_arch() const override { return "qwen2moe"; }
  bool gguf_norm_topk() const override { return false; }
  bool gguf_expert_ff_keys() const override { return true; }
  std::vector<ExternalTensor> gguf_tensors(const ModelConfig& c) const override {
    std::vector<ExternalTensor> t = moe_gguf_tensors(c, llama_style_gguf_tensors(c, true, false));
    // llama.cpp's qwen2moe requires output.weight: a tied head goes there as
    // well (imported back, an untied model with the same values).
    if (c.tied_embeddings) t.push_back({"output.weight", "wte", "", false, 0});
    return t;
  }
};

}  // namespace

const Architecture& qwen2_moe_architecture() {
  static const Qwen2Moe a;
  return a;
}

}  // namespace nk
