// Phi-3 (Phi3ForCausalLM: Phi-3-mini/small/medium, Phi-3.5-mini, Phi-4):
// Llama's block (RMSNorm, SwiGLU, rotate-half RoPE, grouped-query attention,
// no biases) whose Hugging Face checkpoints store the attention's q, k, v as
// one fused qkv_proj [(H + 2 KV) D, C] and the MLP's gate and up as one
// gate_up_proj [2 F, C], gate first: exactly Nekton's fused qkv and
// [gate | up] parameters, so each maps whole. Phi-3-mini-4k attends within a
// sliding window (sliding_window 2047), honoured as Mistral's is
// (ModelConfig::sliding_window). LongRoPE scaling (the 128k models'
// rope_scaling "longrope"/"su" with per-pair short and long factors) is read
// as RopeScalingType::LongRope (model/rope.h: the original context is the
// top-level original_max_position_embeddings, the factor
// max_position_embeddings over it); a partial rotary factor (Phi-4-mini's
// 0.75) turns only the first int(head_dim x factor) values of each head
// (ModelConfig::partial_rotary_factor), the LongRoPE lists one factor per
// pair of those.
//
// llama.cpp's "phi3" graph reads the same fused tensors (attn_qkv, and
// ffn_up holding gate then up) with NEOX rotation, so GGUF keeps the rows as
// they are. It disables Phi's sliding window, so export refuses a window
// shorter than the context, as for the other families.
#include "model/arch.h"

namespace nk {
namespace {

class Phi3 final : public Architecture {
 public:
  std::string name() const override { return "phi3"; }
  std::string display_name() const override { return "Phi-3"; }
  BlockSpec block() const override {
    BlockSpec s;
    s.rms_norm = true;
    s.swiglu = true;
    return s;
  }

  bool partial_rotary() const override { return true; }

  void add_presets(std::map<std::string, ModelConfig>& r) const override {
    ModelConfig c;
    c.arch = "phi3";
    c.tied_embeddings = false;
    c.norm_eps = 1e-5;
    c.rope_theta = 10000.0;
    // For tests, over bytes: a window shorter than the context, as Phi-3-mini-4k.
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = 4;
    c.d_model = 64;
    c.d_ff = 176;
    c.vocab_size = 257;
    c.max_seq_len = 256;
    c.sliding_window = 127;
    r["phi3-tiny"] = c;
    // Phi-3-mini-4k-instruct's published shape (3.8B).
    c.n_layer = 32;
    c.n_head = 32;
    c.n_kv_head = 32;
    c.d_model = 3072;
    c.d_ff = 8192;
    c.vocab_size = 32064;
    c.max_seq_len = 4096;
    c.sliding_window = 2047;
    r["phi3-mini"] = c;
  }

  std::vector<std::pair<std::string, std::string>> hf_classes() const override {
    return {{"Phi3ForCausalLM", "phi3"}};
  }

  void hf_read_config(const HfConfigReader& h, ModelConfig& c) const override {
    hf_read_llama_style(h, c);
    if (h.boolean("attention_bias", false))
      h.unsupported("attention_bias", "attention projections without biases only");
    c.partial_rotary_factor = h.number("partial_rotary_factor", 1.0);
    hf_read_sliding_window(h, c);
    const RopeScaling& r = c.rope_scaling;
    if (r.type == RopeScalingType::LongRope)
      for (const auto& [key, list] :
           {std::pair{"short_factor", &r.short_factor}, std::pair{"long_factor", &r.long_factor}})
        if (int64_t(list->size()) * 2 != c.rotary_dim())
          h.fail_at(fmt::format(
              "field 'rope_scaling.{}' has {} factors; {} rotated units per head have {} pairs",
              key, list->size(), c.rotary_dim(), c.rotary_dim() / 2));
  }

  void hf_write_config(const ModelConfig& c, nlohmann::ordered_json& j) const override {
    hf_write_llama_style(c, j);
    // LongRoPE: transformers takes the original context from the top level
    // and the factor as max_position_embeddings over it; a factor apart from
    // that keeps its attention scaling as an explicit attention_factor.
    const RopeScaling& r = c.rope_scaling;
    const bool longrope = r.type == RopeScalingType::LongRope;
    j["original_max_position_embeddings"] = longrope ? r.original_max_seq_len : c.max_seq_len;
    if (longrope && r.attention_factor == 0 &&
        r.factor != double(c.max_seq_len) / double(r.original_max_seq_len))
      j["rope_scaling"]["attention_factor"] = rope_attention_factor(r);
    hf_write_sliding_window(c, j);
    if (c.partial_rotary_factor != 1.0) j["partial_rotary_factor"] = c.partial_rotary_factor;
    j["attention_bias"] = false;
    j["attention_dropout"] = 0.0;
    j["embd_pdrop"] = 0.0;
    j["resid_pdrop"] = 0.0;
  }

  std::vector<ExternalTensor> hf_tensors(const ModelConfig& c, const std::string&) const override {
    std::vector<ExternalTensor> out;
    auto one = [&](const std::string& param, const std::string& hf) {
      out.push_back({hf, param, "", false, 0});
    };
    one("wte", "model.embed_tokens.weight");
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string h = fmt::format("h.{}.", l), m = fmt::format("model.layers.{}.", l);
      one(h + "ln1.weight", m + "input_layernorm.weight");
      one(h + "attn.qkv.weight", m + "self_attn.qkv_proj.weight");  // [q | k | v] rows
      one(h + "attn.proj.weight", m + "self_attn.o_proj.weight");
      one(h + "ln2.weight", m + "post_attention_layernorm.weight");
      one(h + "mlp.up.weight", m + "mlp.gate_up_proj.weight");  // [gate | up] rows
      one(h + "mlp.down.weight", m + "mlp.down_proj.weight");
    }
    one("ln_f.weight", "model.norm.weight");
    if (!c.tied_embeddings) one("lm_head.weight", "lm_head.weight");
    return out;
  }
  DType hf_default_dtype() const override { return DType::BF16; }  // as Phi-3's are published

  std::string gguf_arch() const override { return "phi3"; }
  std::vector<ExternalTensor> gguf_tensors(const ModelConfig& c) const override {
    std::vector<ExternalTensor> out;
    auto one = [&](const std::string& param, const std::string& name) {
      out.push_back({name, param, "", false, 0});
    };
    one("wte", "token_embd.weight");
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string h = fmt::format("h.{}.", l), b = fmt::format("blk.{}.", l);
      one(h + "ln1.weight", b + "attn_norm.weight");
      one(h + "attn.qkv.weight", b + "attn_qkv.weight");
      one(h + "attn.proj.weight", b + "attn_output.weight");
      one(h + "ln2.weight", b + "ffn_norm.weight");
      one(h + "mlp.up.weight", b + "ffn_up.weight");  // gate then up, as llama.cpp splits it
      one(h + "mlp.down.weight", b + "ffn_down.weight");
    }
    one("ln_f.weight", "output_norm.weight");
    if (!c.tied_embeddings) one("lm_head.weight", "output.weight");
    return out;
  }
};

}  // namespace

const Architecture& phi3_architecture() {
  static const Phi3 a;
  return a;
}

}  // namespace nk
