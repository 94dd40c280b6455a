// Mixtral: Mistral's block (sliding-window attention where the config sets
// one) with a sparse Mixture-of-Experts MLP (nn/moe.h): a router without
// bias over num_local_experts SwiGLU experts, softmax scores, each token's
// top num_experts_per_tok renormalised to sum to 1. Hugging Face's
// MixtralForCausalLM names the router model.layers.L.block_sparse_moe.gate
// and expert e's gate, down and up projections ...experts.e.w1, w2, w3;
// Nekton holds the experts of a layer as one fused tensor per projection
// (moe_params in arch.h), whose parts those tensors are. The load-balancing
// loss coefficient is router_aux_loss_coef (applied by Nekton's training
// whatever output_router_logits says); router_jitter_noise is a training
// noise Nekton does not add (ignored). In GGUF, llama.cpp runs Mixtral as
// its "llama" architecture with llama.expert_count and
// llama.expert_used_count set (softmax router, top-k renormalised), the
// router as blk.L.ffn_gate_inp.weight [E, C] and the experts stacked per
// layer and projection: ffn_gate_exps and ffn_up_exps [E, F, C],
// ffn_down_exps [E, C, F].
#include <fmt/ranges.h>

#include "core/limits.h"
#include "model/arch.h"

namespace nk {
namespace {

class Mixtral final : public Architecture {
 public:
  std::string name() const override { return "mixtral"; }
  std::string display_name() const override { return "Mixtral"; }
  BlockSpec block() const override {
    BlockSpec s;
    s.rms_norm = true;
    s.swiglu = true;
    return s;
  }
  bool moe() const override { return true; }

  void add_presets(std::map<std::string, ModelConfig>& r) const override {
    ModelConfig c;
    c.arch = "mixtral";
    c.tied_embeddings = false;
    c.norm_eps = 1e-5;
    c.rope_theta = 1e6;
    c.num_experts_per_tok = 2;
    c.norm_topk_prob = true;
    c.moe_aux_loss_coeff = 0.02;  // Mixtral 8x7B's published router_aux_loss_coef
    // For tests, over bytes: four experts of 64 units, top-2.
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.d_model = 64;
    c.d_ff = 64;
    c.moe_d_ff = 64;
    c.num_experts = 4;
    c.vocab_size = 257;
    c.max_seq_len = 256;
    r["mixtral-tiny"] = c;
    // Mixtral 8x7B's published shape (full attention: sliding_window null).
    c.n_layer = 32;
    c.n_head = 32;
    c.n_kv_head = 8;
    c.d_model = 4096;
    c.d_ff = 14336;
    c.moe_d_ff = 14336;
    c.num_experts = 8;
    c.vocab_size = 32000;
    c.max_seq_len = 32768;
    r["mixtral-8x7b"] = c;
  }

  // Nekton trains a Mixtral-style model with any routing (DeepSeek-V3's
  // sigmoid scores, groups, bias, scaling, leading dense layers); HF's
  // MixtralForCausalLM has none of them, so export refuses them by key.
  void check_hf_routing(const ModelConfig& c) const {
    const char* why = "Hugging Face's MixtralForCausalLM has no such setting";
    if (c.moe_score_func != "softmax")
      fail("model.moe_score_func = {}: Mixtral's router scores are softmax ({})", c.moe_score_func,
           why);
    if (c.moe_n_group != 1) fail("model.moe_n_group = {}: {}", c.moe_n_group, why);
    if (c.moe_routed_scaling != 1.0)
      fail("model.moe_routed_scaling = {}: {}", c.moe_routed_scaling, why);
    if (c.has_score_bias()) fail("model.moe_score_bias: an expert score bias: {}", why);
    if (c.moe_first_dense_layers != 0)
      fail("model.moe_first_dense_layers = {}: {}", c.moe_first_dense_layers, why);
    if (!c.moe_dense_layers.empty())
      fail("model.moe_dense_layers = {}: {}", fmt::join(c.moe_dense_layers, ","), why);
    if (!c.norm_topk_prob) fail("model.norm_topk_prob = false: {}", why);
  }

  void validate(const ModelConfig& c, const std::string& p) const override {
    if (c.moe_shared_d_ff != 0)
      fail("{}moe_shared_d_ff: Mixtral has no shared expert (got {}; model.arch=qwen2_moe has)", p,
           c.moe_shared_d_ff);
  }

  std::vector<std::pair<std::string, std::string>> hf_classes() const override {
    return {{"MixtralForCausalLM", "mixtral"}};
  }

  void hf_read_config(const HfConfigReader& h, ModelConfig& c) const override {
    hf_read_llama_style(h, c);
    hf_read_sliding_window(h, c);
    c.num_experts = h.positive("num_local_experts", limits::kMaxExperts, "experts");
    c.num_experts_per_tok = h.positive("num_experts_per_tok", limits::kMaxExperts, "experts");
    if (c.num_experts_per_tok > c.num_experts)
      h.fail_at(fmt::format("'num_experts_per_tok' = {} exceeds 'num_local_experts' = {}",
                            c.num_experts_per_tok, c.num_experts));
    c.moe_d_ff = c.d_ff;
    c.norm_topk_prob = true;
    c.moe_score_func = "softmax";
    c.moe_aux_loss_coeff = 0.0;
    if (h.has("router_aux_loss_coef")) {
      const nlohmann::json& v = h.at("router_aux_loss_coef");
      if (!v.is_number() || !(v.get<double>() >= 0))
        h.fail_at("field 'router_aux_loss_coef' must be a number >= 0, got " + v.dump());
      c.moe_aux_loss_coeff = v.get<double>();
    }
    if (h.boolean("attention_bias", false))
      h.unsupported("attention_bias", "attention projections without biases only");
  }

  void hf_write_config(const ModelConfig& c, nlohmann::ordered_json& j) const override {
    check_hf_routing(c);
    hf_write_llama_style(c, j);
    j["intermediate_size"] = c.expert_d_ff();
    hf_write_sliding_window(c, j);
    j["attention_dropout"] = 0.0;
    j["num_local_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["output_router_logits"] = false;
    j["router_aux_loss_coef"] = c.moe_aux_loss_coeff;
    j["router_jitter_noise"] = 0.0;
  }

  // Llama's names for the attention and norms; the experts' per parameter,
  // each parameter's parts consecutive (what import assembles from).
  std::vector<ExternalTensor> hf_tensors(const ModelConfig& c, const std::string&) const override {
    std::vector<ExternalTensor> dense = llama_style_hf_tensors(c, false), out;
    for (const ExternalTensor& t : dense) {
      if (t.param.find(".mlp.") != std::string::npos) continue;  // no dense MLP here
      out.push_back(t);
      const bool last_of_layer = t.param.ends_with("ln2.weight");
      if (!last_of_layer) continue;
      const std::string h = t.param.substr(0, t.param.size() - std::string("ln2.weight").size());
      const std::string m = t.name.substr(0, t.name.find("post_attention_layernorm"));
      const std::string moe = m + "block_sparse_moe.";
      out.push_back({moe + "gate.weight", h + "moe.router.weight", "", false, 0});
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::string x = fmt::format("{}experts.{}.", moe, e);
        out.push_back({x + "w1.weight", h + "moe.up.weight", fmt::format("e{}.gate", e), false, 0});
        out.push_back({x + "w3.weight", h + "moe.up.weight", fmt::format("e{}.up", e), false, 0});
      }
      for (int64_t e = 0; e < c.num_experts; ++e)
        out.push_back({fmt::format("{}experts.{}.w2.weight", moe, e), h + "moe.down.weight",
                       fmt::format("e{}", e), false, 0});
    }
    return out;
  }
  DType hf_default_dtype() const override { return DType::BF16; }  // as Mixtral's are published

  std::string gguf_arch() const override { return "llama"; }
  bool gguf_rope_freqs() const override { return true; }
  // Llama's attention and norms; in place of the dense MLP the router and
  // the three stacked expert tensors (ExternalTensor::experts).
  std::vector<ExternalTensor> gguf_tensors(const ModelConfig& c) const override {
    return moe_gguf_tensors(c, llama_style_gguf_tensors(c, false, true));
  }
};

}  // namespace

const Architecture& mixtral_architecture() {
  static const Mixtral a;
  return a;
}

}  // namespace nk
