// DeepSeek-V2 and DeepSeek-V3 (Hugging Face's DeepseekV2ForCausalLM and
// DeepseekV3ForCausalLM): Multi-head Latent Attention (nn/latent_attention.h,
// BlockSpec::latent_attention) and DeepSeekMoE: the first
// first_k_dense_replace layers a dense SwiGLU MLP of intermediate_size, the
// others n_routed_experts SwiGLU experts of moe_intermediate_size plus
// n_shared_experts x moe_intermediate_size shared units every token goes
// through, ungated.
//
// V2 scores the experts by softmax(router x) and takes each token's top
// num_experts_per_tok (topk_method greedy), weighted by the scores times
// routed_scaling_factor (or renormalised, unscaled, with norm_topk_prob, as
// DeepSeek's modelling code does). V3 scores by sigmoid, chooses on the
// scores plus e_score_correction_bias from the topk_group best of n_group
// groups (noaux_tc: each group scored by its two best), and weights by the
// unbiased scores (renormalised when norm_topk_prob) times
// routed_scaling_factor: the existing MoE routing (ModelConfig::moe_*).
//
// Attention: q_proj, or q_a_proj, q_a_layernorm, q_b_proj (q_lora_rank);
// kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj; o_proj. The rotary values
// stay in DeepSeek's pairs layout in every format (Hugging Face rotates them
// as pairs: rope_interleave, V3's default; V2's complex rotation). The
// scores' factor is 1/sqrt(qk_nope + qk_rope) times yarn's
// mscale(factor, mscale_all_dim) squared (ModelConfig::attn_scale).
//
// GGUF: llama.cpp's "deepseek2" (attn_q or attn_q_a / attn_q_a_norm /
// attn_q_b, attn_kv_a_mqa, attn_kv_a_norm, kv_b split per head as attn_k_b /
// attn_v_b, or the older unsplit attn_kv_b, attn_output; the MoE tensors as
// dots1's), routing in the metadata (Architecture::gguf_deepseek_routing).
#include "core/limits.h"
#include "model/arch.h"

namespace nk {
namespace {

class Deepseek : public Architecture {
 public:
  explicit Deepseek(bool v3) : v3_(v3) {}
  std::string name() const override { return v3_ ? "deepseek_v3" : "deepseek_v2"; }
  std::string display_name() const override { return v3_ ? "DeepSeek-V3" : "DeepSeek-V2"; }
  BlockSpec block() const override {
    BlockSpec s;
    s.rms_norm = true;
    s.swiglu = true;
    s.latent_attention = true;
    return s;
  }
  bool moe() const override { return true; }

  void add_presets(std::map<std::string, ModelConfig>& r) const override {
    ModelConfig c;
    c.arch = name();
    c.norm_eps = 1e-6;
    c.rope_theta = 10000;
    c.tied_embeddings = false;
    // For tests, over bytes: 4 heads of 24 + 8 rotated values (values of
    // 16) over a latent of 32; a dense first layer, then eight experts of
    // 32 units and a shared expert of 2 x 32.
    c.n_layer = 3;
    c.n_head = 4;
    c.n_kv_head = 4;
    c.d_model = 64;
    c.d_ff = 128;
    c.attn_head_dim = 32;
    c.qk_rope_head_dim = 8;
    c.v_head_dim = 16;
    c.kv_lora_rank = 32;
    c.q_lora_rank = v3_ ? 48 : 0;
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    c.moe_d_ff = 32;
    c.moe_shared_d_ff = 64;
    c.moe_first_dense_layers = 1;
    c.moe_aux_loss_coeff = 0.0;
    if (v3_) {
      c.moe_score_func = "sigmoid";
      c.moe_score_bias = true;
      c.norm_topk_prob = true;
      c.moe_n_group = 4;
      c.moe_topk_group = 2;
      c.moe_routed_scaling = 2.5;
    } else {
      c.moe_score_func = "softmax";
      c.norm_topk_prob = false;
      c.moe_routed_scaling = 1.0;
    }
    c.vocab_size = 257;
    c.max_seq_len = 256;
    r[name() + "-tiny"] = c;
  }

  void validate(const ModelConfig& c, const std::string& p) const override {
    if (v3_ && (c.moe_score_func != "sigmoid" || !c.has_score_bias()))
      fail(
          "{}moe_score_func: DeepSeek-V3's router scores are sigmoid with an "
          "e_score_correction_bias (got '{}', score bias {})",
          p, c.moe_score_func, c.has_score_bias());
    if (!v3_ && (c.moe_score_func != "softmax" || c.has_score_bias() || c.moe_n_group != 1))
      fail(
          "{}moe_score_func: DeepSeek-V2's router here is softmax, greedy, without a score bias "
          "(got '{}', score bias {}, moe_n_group {})",
          p, c.moe_score_func, c.has_score_bias(), c.moe_n_group);
    if (c.moe_shared_d_ff == 0 || c.moe_shared_expert_gate)
      fail(
          "{}moe_shared_d_ff: {} has an ungated shared expert in every MoE layer (got {}, gate {})",
          p, display_name(), c.moe_shared_d_ff, c.moe_shared_expert_gate);
  }

  std::vector<std::pair<std::string, std::string>> hf_classes() const override {
    if (v3_) return {{"DeepseekV3ForCausalLM", "deepseek_v3"}};
    return {{"DeepseekV2ForCausalLM", "deepseek_v2"}};
  }

  void hf_read_config(const HfConfigReader& h, ModelConfig& c) const override {
    c.d_model = h.positive("hidden_size", limits::kHidden, "hidden units");
    c.d_ff = h.positive("intermediate_size", limits::kFfn, "MLP units");
    c.n_layer = h.positive("num_hidden_layers", limits::kLayers, "layers");
    c.n_head = h.positive("num_attention_heads", limits::kHeads, "heads");
    // num_key_value_heads is in the config but MLA has a key per head.
    c.n_kv_head = c.n_head;
    c.vocab_size = h.positive("vocab_size", limits::kVocab, "token ids");
    c.max_seq_len = h.positive("max_position_embeddings", limits::kSeqLen, "positions");
    c.norm_eps = h.number("rms_norm_eps", 1e-6);
    rope_from_hf_config(h.object(), h.where(), c.rope_theta, c.rope_scaling);
    c.tied_embeddings = h.boolean("tie_word_embeddings", false);
    c.init_std = h.number("initializer_range", 0.02);
    if (h.string("hidden_act", "silu") != "silu")
      h.unsupported("hidden_act", "only silu (SwiGLU) is supported");
    if (h.boolean("attention_bias", false))
      h.unsupported("attention_bias", "attention projections without biases only");
    if (!h.boolean("rope_interleave", true))
      h.unsupported("rope_interleave", "only the interleaved (pairs) rotary layout is supported");
    c.q_lora_rank = h.has("q_lora_rank") ? h.positive("q_lora_rank", limits::kHidden, "units") : 0;
    c.kv_lora_rank = h.positive("kv_lora_rank", limits::kHidden, "units");
    c.qk_rope_head_dim = h.positive("qk_rope_head_dim", limits::kHidden, "units");
    const int64_t nope = h.positive("qk_nope_head_dim", limits::kHidden, "units");
    c.attn_head_dim = nope + c.qk_rope_head_dim;
    c.v_head_dim = h.positive("v_head_dim", limits::kHidden, "units");

    c.num_experts = h.positive("n_routed_experts", limits::kMaxExperts, "experts");
    c.num_experts_per_tok = h.positive("num_experts_per_tok", limits::kMaxExperts, "experts");
    if (c.num_experts_per_tok > c.num_experts)
      h.fail_at(fmt::format("'num_experts_per_tok' = {} exceeds 'n_routed_experts' = {}",
                            c.num_experts_per_tok, c.num_experts));
    c.moe_d_ff = h.positive("moe_intermediate_size", limits::kFfn, "MLP units");
    c.moe_shared_d_ff = h.positive("n_shared_experts", limits::kMaxExperts, "experts") * c.moe_d_ff;
    c.moe_shared_expert_gate = false;
    if (h.integer("moe_layer_freq", 1) != 1)
      h.unsupported("moe_layer_freq", "every layer after first_k_dense_replace is MoE (1) only");
    c.moe_first_dense_layers = h.integer("first_k_dense_replace", 0);
    if (c.moe_first_dense_layers < 0 || c.moe_first_dense_layers >= c.n_layer)
      h.fail_at(fmt::format("'first_k_dense_replace' = {} must be in [0, num_hidden_layers = {})",
                            c.moe_first_dense_layers, c.n_layer));
    c.norm_topk_prob = h.boolean("norm_topk_prob", false);
    c.moe_routed_scaling = h.number("routed_scaling_factor", 1.0);
    c.moe_aux_loss_coeff = 0.0;
    const std::string method = h.string("topk_method", v3_ ? "noaux_tc" : "greedy");
    if (v3_) {
      if (method != "noaux_tc")
        h.unsupported("topk_method", "DeepSeek-V3's noaux_tc only, got '" + method + "'");
      c.moe_score_func = "sigmoid";
      c.moe_score_bias = true;
      c.moe_n_group = h.positive("n_group", limits::kMaxExperts, "groups");
      c.moe_topk_group = h.positive("topk_group", limits::kMaxExperts, "groups");
      if (c.num_experts % c.moe_n_group || c.num_experts / c.moe_n_group < 2)
        h.fail_at(
            fmt::format("'n_group' = {} must divide 'n_routed_experts' = {} into groups of 2 "
                        "or more (each scored by its two best)",
                        c.moe_n_group, c.num_experts));
    } else {
      if (method != "greedy")
        h.unsupported("topk_method",
                      "greedy only (group_limited_greedy's max-scored groups are not supported "
                      "yet), got '" +
                          method + "'");
      if (h.string("scoring_func", "softmax") != "softmax")
        h.unsupported("scoring_func", "DeepSeek-V2's softmax only");
      c.moe_score_func = "softmax";
      c.moe_score_bias = false;
      c.moe_n_group = c.moe_topk_group = 1;
      // DeepSeek-V2's gate scales only the weights it does not renormalise.
      if (c.norm_topk_prob) c.moe_routed_scaling = 1.0;
    }
  }

  void hf_write_config(const ModelConfig& c, nlohmann::ordered_json& j) const override {
    if (c.moe_shared_d_ff % c.expert_d_ff())
      fail(
          "model.moe_shared_d_ff = {}: {} gives the shared experts n_shared_experts x "
          "moe_intermediate_size ({}) units; {} is not a multiple",
          c.moe_shared_d_ff, display_name(), c.expert_d_ff(), c.moe_shared_d_ff);
    if (!c.moe_dense_layers.empty())
      fail("model.moe_dense_layers: {} has only leading dense layers (first_k_dense_replace)",
           display_name());
    if (!v3_ && c.norm_topk_prob && c.moe_routed_scaling != 1.0)
      fail(
          "model.moe_routed_scaling = {}: DeepSeek-V2's gate does not scale renormalised "
          "weights (model.norm_topk_prob = true)",
          c.moe_routed_scaling);
    j["hidden_size"] = c.d_model;
    j["intermediate_size"] = c.d_ff;
    j["moe_intermediate_size"] = c.expert_d_ff();
    j["num_hidden_layers"] = c.n_layer;
    j["num_attention_heads"] = c.n_head;
    j["num_key_value_heads"] = c.n_head;
    j["n_shared_experts"] = c.moe_shared_d_ff / c.expert_d_ff();
    j["n_routed_experts"] = c.num_experts;
    j["routed_scaling_factor"] = c.moe_routed_scaling;
    j["kv_lora_rank"] = c.kv_lora_rank;
    j["q_lora_rank"] =
        c.q_lora_rank > 0 ? nlohmann::ordered_json(c.q_lora_rank) : nlohmann::ordered_json(nullptr);
    j["qk_rope_head_dim"] = c.qk_rope_head_dim;
    j["v_head_dim"] = c.v_head_dim;
    j["qk_nope_head_dim"] = c.head_dim() - c.qk_rope_head_dim;
    j["topk_method"] = v3_ ? "noaux_tc" : "greedy";
    j["n_group"] = c.moe_n_group;
    j["topk_group"] = c.moe_topk_group;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_layer_freq"] = 1;
    j["first_k_dense_replace"] = c.moe_first_dense_layers;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["scoring_func"] = v3_ ? "sigmoid" : "softmax";
    j["hidden_act"] = "silu";
    j["max_position_embeddings"] = c.max_seq_len;
    j["initializer_range"] = c.init_std;
    j["rms_norm_eps"] = c.norm_eps;
    j["rope_theta"] = c.rope_theta;
    j["rope_scaling"] = rope_scaling_to_hf(c.rope_scaling);
    j["attention_bias"] = false;
    j["attention_dropout"] = 0.0;
    if (v3_) j["rope_interleave"] = true;
  }

  std::vector<ExternalTensor> hf_tensors(const ModelConfig& c, const std::string&) const override {
    std::vector<ExternalTensor> out;
    auto one = [&](const std::string& hf, const std::string& param, const std::string& part = "") {
      out.push_back({hf, param, part, false, 0});
    };
    one("model.embed_tokens.weight", "wte");
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string h = fmt::format("h.{}.", l), m = fmt::format("model.layers.{}.", l);
      const std::string a = m + "self_attn.";
      one(m + "input_layernorm.weight", h + "ln1.weight");
      if (c.q_lora_rank > 0) {
        one(a + "q_a_proj.weight", h + "attn.q_a.weight");
        one(a + "q_a_layernorm.weight", h + "attn.q_a_norm.weight");
        one(a + "q_b_proj.weight", h + "attn.q_b.weight");
      } else {
        one(a + "q_proj.weight", h + "attn.q.weight");
      }
      one(a + "kv_a_proj_with_mqa.weight", h + "attn.kv_a.weight");
      one(a + "kv_a_layernorm.weight", h + "attn.kv_a_norm.weight");
      one(a + "kv_b_proj.weight", h + "attn.kv_b.weight");
      one(a + "o_proj.weight", h + "attn.proj.weight");
      one(m + "post_attention_layernorm.weight", h + "ln2.weight");
      const std::string x = m + "mlp.";
      if (!c.moe_layer(l)) {
        one(x + "gate_proj.weight", h + "mlp.up.weight", "gate");
        one(x + "up_proj.weight", h + "mlp.up.weight", "up");
        one(x + "down_proj.weight", h + "mlp.down.weight");
        continue;
      }
      one(x + "gate.weight", h + "moe.router.weight");
      if (c.has_score_bias()) one(x + "gate.e_score_correction_bias", h + "moe.score_bias");
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::string ex = fmt::format("{}experts.{}.", x, e);
        one(ex + "gate_proj.weight", h + "moe.up.weight", fmt::format("e{}.gate", e));
        one(ex + "up_proj.weight", h + "moe.up.weight", fmt::format("e{}.up", e));
      }
      for (int64_t e = 0; e < c.num_experts; ++e)
        one(fmt::format("{}experts.{}.down_proj.weight", x, e), h + "moe.down.weight",
            fmt::format("e{}", e));
      one(x + "shared_experts.gate_proj.weight", h + "moe.shared_up.weight", "gate");
      one(x + "shared_experts.up_proj.weight", h + "moe.shared_up.weight", "up");
      one(x + "shared_experts.down_proj.weight", h + "moe.shared_down.weight");
    }
    one("model.norm.weight", "ln_f.weight");
    if (!c.tied_embeddings) one("lm_head.weight", "lm_head.weight");
    return out;
  }
  DType hf_default_dtype() const override { return DType::BF16; }

  std::string gguf_arch() const override { return "deepseek2"; }
  bool gguf_expert_ff_keys() const override { return true; }
  bool gguf_deepseek_routing() const override { return true; }
  std::vector<ExternalTensor> gguf_tensors(const ModelConfig& c) const override {
    std::vector<ExternalTensor> out;
    auto one = [&](const std::string& name, const std::string& param, const std::string& part = "",
                   int64_t experts = 0) {
      out.push_back({name, param, part, false, 0, experts});
    };
    one("token_embd.weight", "wte");
    const int64_t E = c.num_experts;
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string h = fmt::format("h.{}.", l), b = fmt::format("blk.{}.", l);
      one(b + "attn_norm.weight", h + "ln1.weight");
      if (c.q_lora_rank > 0) {
        one(b + "attn_q_a.weight", h + "attn.q_a.weight");
        one(b + "attn_q_a_norm.weight", h + "attn.q_a_norm.weight");
        one(b + "attn_q_b.weight", h + "attn.q_b.weight");
      } else {
        one(b + "attn_q.weight", h + "attn.q.weight");
      }
      one(b + "attn_kv_a_mqa.weight", h + "attn.kv_a.weight");
      one(b + "attn_kv_a_norm.weight", h + "attn.kv_a_norm.weight");
      // kv_b [H (nope + v), kv_rank]: head h's nope rows transposed as
      // attn_k_b's slice h [kv_rank, nope], its v rows as attn_v_b's [v, kv_rank];
      // or, in older files, whole as attn_kv_b.
      ExternalTensor kb;
      kb.name = b + "attn_k_b.weight";
      kb.param = h + "attn.kv_b.weight";
      kb.transposed = true;
      kb.head_split = c.n_head;
      kb.head_rows = c.head_dim() - c.qk_rope_head_dim;
      kb.kv_b = ExternalTensor::KvB::Split;
      ExternalTensor vb;
      vb.name = b + "attn_v_b.weight";
      vb.param = h + "attn.kv_b.weight";
      vb.head_split = c.n_head;
      vb.head_row0 = kb.head_rows;
      vb.head_rows = c.out_head_dim();
      vb.kv_b = ExternalTensor::KvB::Split;
      ExternalTensor kvb;
      kvb.name = b + "attn_kv_b.weight";
      kvb.param = h + "attn.kv_b.weight";
      kvb.kv_b = ExternalTensor::KvB::Unsplit;
      out.insert(out.end(), {kb, vb, kvb});
      one(b + "attn_output.weight", h + "attn.proj.weight");
      one(b + "ffn_norm.weight", h + "ln2.weight");
      if (!c.moe_layer(l)) {
        one(b + "ffn_gate.weight", h + "mlp.up.weight", "gate");
        one(b + "ffn_up.weight", h + "mlp.up.weight", "up");
        one(b + "ffn_down.weight", h + "mlp.down.weight");
        continue;
      }
      one(b + "ffn_gate_inp.weight", h + "moe.router.weight");
      if (c.has_score_bias()) one(b + "exp_probs_b.bias", h + "moe.score_bias");
      one(b + "ffn_gate_exps.weight", h + "moe.up.weight", "e{}.gate", E);
      one(b + "ffn_up_exps.weight", h + "moe.up.weight", "e{}.up", E);
      one(b + "ffn_down_exps.weight", h + "moe.down.weight", "e{}", E);
      one(b + "ffn_gate_shexp.weight", h + "moe.shared_up.weight", "gate");
      one(b + "ffn_up_shexp.weight", h + "moe.shared_up.weight", "up");
      one(b + "ffn_down_shexp.weight", h + "moe.shared_down.weight");
    }
    one("output_norm.weight", "ln_f.weight");
    // llama.cpp's deepseek2 reads output.weight, tied or not.
    one("output.weight", c.tied_embeddings ? "wte" : "lm_head.weight");
    return out;
  }

 private:
  bool v3_;
};

}  // namespace

const Architecture& deepseek_v2_architecture() {
  static const Deepseek a(false);
  return a;
}

const Architecture& deepseek_v3_architecture() {
  static const Deepseek a(true);
  return a;
}

}  // namespace nk
