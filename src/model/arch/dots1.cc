// dots.llm1 (rednote-hilab; Hugging Face's Dots1ForCausalLM): Qwen3's
// attention (no biases, per-head RMSNorms on q and k before the rotation)
// with DeepSeek-V3's fine-grained Mixture of Experts: the first
// first_k_dense_replace layers a dense SwiGLU MLP of intermediate_size, the
// others n_routed_experts SwiGLU experts of moe_intermediate_size scored by
// sigmoid(router x), each token's top num_experts_per_tok chosen from its
// topk_group best of n_group groups on the scores plus
// e_score_correction_bias (each group scored by the sum of its two best),
// weighted by the unbiased scores (renormalised when norm_topk_prob) times
// routed_scaling_factor, plus a shared expert of n_shared_experts x
// moe_intermediate_size units that every token goes through, ungated
// (model/model_config.h's moe_score_func, moe_n_group, moe_topk_group,
// moe_routed_scaling, moe_score_bias, moe_first_dense_layers). Hugging
// Face's names: model.layers.L.mlp.gate.weight (router) and
// mlp.gate.e_score_correction_bias, mlp.experts.e.{gate,up,down}_proj,
// mlp.shared_experts.{gate,up,down}_proj, and the dense layers'
// mlp.{gate,up,down}_proj. The published config has no auxiliary loss:
// Nekton trains it with aux-loss-free balancing if asked
// (model.moe_bias_update_rate), the bias moving as DeepSeek-V3's.
// Sliding-window layers are refused. In GGUF it is llama.cpp's "dots1":
// Qwen3's attention tensors, the dense layers' ffn_{gate,up,down}, the MoE
// layers' router, stacked experts, exp_probs_b.bias and ffn_*_shexp, with
// the routing in the metadata (Architecture::gguf_deepseek_routing).
#include "core/limits.h"
#include "model/arch.h"

namespace nk {
namespace {

class Dots1 final : public Architecture {
 public:
  std::string name() const override { return "dots1"; }
  std::string display_name() const override { return "dots.llm1"; }
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
    c.arch = "dots1";
    c.norm_eps = 1e-5;
    c.rope_theta = 1e6;
    c.tied_embeddings = false;
    c.moe_score_func = "sigmoid";
    c.moe_score_bias = true;
    c.norm_topk_prob = true;
    c.moe_aux_loss_coeff = 0.0;
    // For tests, over bytes: a dense first layer, then eight experts of 32
    // units in four groups (each token's 2 from its best 2 groups), scaled
    // by 2.5, and a shared expert of 2 x 32.
    c.n_layer = 3;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.d_model = 64;
    c.d_ff = 128;
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    c.moe_d_ff = 32;
    c.moe_shared_d_ff = 64;
    c.moe_n_group = 4;
    c.moe_topk_group = 2;
    c.moe_routed_scaling = 2.5;
    c.moe_first_dense_layers = 1;
    c.vocab_size = 257;
    c.max_seq_len = 256;
    r["dots1-tiny"] = c;
  }

  void validate(const ModelConfig& c, const std::string& p) const override {
    validate_deepseek_moe(c, p, "dots.llm1");
  }

  std::vector<std::pair<std::string, std::string>> hf_classes() const override {
    return {{"Dots1ForCausalLM", "dots1"}};
  }
  // transformers has no Dots1ForSequenceClassification.
  std::string hf_classifier_class() const override { return ""; }

  void hf_read_config(const HfConfigReader& h, ModelConfig& c) const override {
    hf_read_llama_style(h, c, /*any_head_dim=*/true);
    if (h.boolean("attention_bias", false))
      h.unsupported("attention_bias", "attention projections without biases only");
    // Dots1Config: layer i slides when sliding_window is set and
    // i >= max_window_layers, unless layer_types says otherwise.
    if (h.has("layer_types")) {
      const nlohmann::json& t = h.at("layer_types");
      if (!t.is_array()) h.fail_at("field 'layer_types' must be a list, got " + t.dump());
      for (const nlohmann::json& x : t)
        if (x != "full_attention")
          h.unsupported("layer_types", "only full_attention layers are supported");
    } else if (h.has("sliding_window") && h.integer("max_window_layers", 62) < c.n_layer) {
      h.unsupported("max_window_layers",
                    "sliding-window layers (from max_window_layers on) are not supported");
    }
    hf_read_deepseek_moe(h, c, DeepseekMoeDefaults{});
  }

  void hf_write_config(const ModelConfig& c, nlohmann::ordered_json& j) const override {
    hf_check_deepseek_moe(c, "Dots1Config");
    hf_write_llama_style(c, j);
    j["attention_bias"] = false;
    j["attention_dropout"] = 0.0;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.n_layer;
    hf_write_deepseek_moe(c, j);
  }

  // Llama's names (with Qwen3's q/k norms) for the attention, norms and the
  // dense layers' MLP; each MoE layer's block after its post-attention norm.
  std::vector<ExternalTensor> hf_tensors(const ModelConfig& c, const std::string&) const override {
    return deepseek_moe_hf_tensors(c, llama_style_hf_tensors(c, false, /*qk_norm=*/true));
  }
  DType hf_default_dtype() const override { return DType::BF16; }  // as dots.llm1 is published

  std::string gguf_arch() const override { return "dots1"; }
  bool gguf_expert_ff_keys() const override { return true; }
  bool gguf_deepseek_routing() const override { return true; }
  std::vector<ExternalTensor> gguf_tensors(const ModelConfig& c) const override {
    // llama.cpp's dots1 sizes attn_k and attn_v by the query heads (dots.llm1
    // has 32 of each).
    if (c.n_kv_head != c.n_head)
      fail(
          "model.n_kv_head = {}: llama.cpp's dots1 architecture has as many key/value heads as "
          "query heads (model.n_head = {})",
          c.n_kv_head, c.n_head);
    std::vector<ExternalTensor> t =
        moe_gguf_tensors(c, llama_style_gguf_tensors(c, false, false, /*qk_norm=*/true));
    // llama.cpp's dots1 requires output.weight: a tied head goes there too.
    if (c.tied_embeddings) t.push_back({"output.weight", "wte", "", false, 0});
    return t;
  }
};

}  // namespace

std::vector<ExternalTensor> deepseek_moe_hf_tensors(const ModelConfig& c,
                                                    const std::vector<ExternalTensor>& dense) {
  std::vector<ExternalTensor> out;
  const std::string ln2 = "ln2.weight";
  for (const ExternalTensor& t : dense) {
    const int64_t l =
        t.param.starts_with("h.") ? std::stoll(t.param.substr(2, t.param.find('.', 2) - 2)) : -1;
    if (t.param.find(".mlp.") != std::string::npos && c.moe_layer(l)) continue;
    out.push_back(t);
    if (!t.param.ends_with(ln2) || !c.moe_layer(l)) continue;
    const std::string h = t.param.substr(0, t.param.size() - ln2.size());
    const std::string m = t.name.substr(0, t.name.find("post_attention_layernorm")) + "mlp.";
    out.push_back({m + "gate.weight", h + "moe.router.weight", ""});
    out.push_back({m + "gate.e_score_correction_bias", h + "moe.score_bias", ""});
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const std::string x = fmt::format("{}experts.{}.", m, e);
      out.push_back({x + "gate_proj.weight", h + "moe.up.weight", fmt::format("e{}.gate", e)});
      out.push_back({x + "up_proj.weight", h + "moe.up.weight", fmt::format("e{}.up", e)});
    }
    for (int64_t e = 0; e < c.num_experts; ++e)
      out.push_back({fmt::format("{}experts.{}.down_proj.weight", m, e), h + "moe.down.weight",
                     fmt::format("e{}", e)});
    out.push_back({m + "shared_experts.gate_proj.weight", h + "moe.shared_up.weight", "gate"});
    out.push_back({m + "shared_experts.up_proj.weight", h + "moe.shared_up.weight", "up"});
    out.push_back({m + "shared_experts.down_proj.weight", h + "moe.shared_down.weight", ""});
  }
  return out;
}

void validate_deepseek_moe(const ModelConfig& c, const std::string& p, const char* family) {
  if (c.moe_score_func != "sigmoid")
    fail("{}moe_score_func: {}'s router scores are sigmoid, got '{}'", p, family, c.moe_score_func);
  if (!c.has_score_bias())
    fail("{}moe_score_bias: {}'s router has an e_score_correction_bias (set true)", p, family);
  if (c.moe_shared_d_ff == 0 || c.moe_shared_expert_gate)
    fail(
        "{}moe_shared_d_ff: {} has an ungated shared expert in every MoE layer (got "
        "moe_shared_d_ff = {}, moe_shared_expert_gate = {})",
        p, family, c.moe_shared_d_ff, c.moe_shared_expert_gate);
}

void hf_read_deepseek_moe(const HfConfigReader& h, ModelConfig& c, const DeepseekMoeDefaults& d) {
  c.num_experts = h.positive("n_routed_experts", limits::kMaxExperts, "experts");
  c.num_experts_per_tok = h.positive("num_experts_per_tok", limits::kMaxExperts, "experts");
  if (c.num_experts_per_tok > c.num_experts)
    h.fail_at(fmt::format("'num_experts_per_tok' = {} exceeds 'n_routed_experts' = {}",
                          c.num_experts_per_tok, c.num_experts));
  c.moe_d_ff = h.positive("moe_intermediate_size", limits::kFfn, "MLP units");
  auto count = [&](const char* key, int64_t fallback, const char* what) {
    return fallback > 0 && !h.has(key) ? fallback : h.positive(key, limits::kMaxExperts, what);
  };
  c.moe_shared_d_ff = count("n_shared_experts", d.shared_experts, "experts") * c.moe_d_ff;
  c.moe_shared_expert_gate = false;
  c.moe_score_func = "sigmoid";
  c.moe_score_bias = true;
  c.norm_topk_prob = h.boolean("norm_topk_prob", d.norm_topk_prob);
  c.moe_n_group = count("n_group", d.groups, "groups");
  c.moe_topk_group = count("topk_group", d.groups, "groups");
  if (c.moe_n_group > 1 && (c.num_experts % c.moe_n_group || c.num_experts / c.moe_n_group < 2))
    h.fail_at(
        fmt::format("'n_group' = {} must divide 'n_routed_experts' = {} into groups of 2 "
                    "or more (each scored by its two best)",
                    c.moe_n_group, c.num_experts));
  c.moe_routed_scaling = h.number("routed_scaling_factor", 1.0);
  c.moe_first_dense_layers = h.integer("first_k_dense_replace", d.first_dense_layers);
  if (c.moe_first_dense_layers < 0 || c.moe_first_dense_layers >= c.n_layer)
    h.fail_at(fmt::format("'first_k_dense_replace' = {} must be in [0, num_hidden_layers = {})",
                          c.moe_first_dense_layers, c.n_layer));
  c.moe_aux_loss_coeff = 0.0;
}

void hf_check_deepseek_moe(const ModelConfig& c, const char* config_class) {
  if (c.moe_shared_d_ff % c.expert_d_ff())
    fail(
        "model.moe_shared_d_ff = {}: {} gives the shared expert n_shared_experts x "
        "moe_intermediate_size ({}) units; {} is not a multiple",
        c.moe_shared_d_ff, config_class, c.expert_d_ff(), c.moe_shared_d_ff);
  if (!c.moe_dense_layers.empty())
    fail("model.moe_dense_layers: {} has only leading dense layers (first_k_dense_replace)",
         config_class);
}

void hf_write_deepseek_moe(const ModelConfig& c, nlohmann::ordered_json& j) {
  j["moe_intermediate_size"] = c.expert_d_ff();
  j["n_routed_experts"] = c.num_experts;
  j["n_shared_experts"] = c.moe_shared_d_ff / c.expert_d_ff();
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["n_group"] = c.moe_n_group;
  j["topk_group"] = c.moe_topk_group;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["routed_scaling_factor"] = c.moe_routed_scaling;
  j["first_k_dense_replace"] = c.moe_first_dense_layers;
}

const Architecture& dots1_architecture() {
  static const Dots1 a;
  return a;
}

}  // namespace nk
