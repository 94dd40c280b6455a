// Qwen3 (dense): Llama's block without any attention bias, with an RMSNorm
// over each head of q and of k before the rotation (q_norm, k_norm: weight
// [head_dim], epsilon rms_norm_eps), and a head size of its own (head_dim
// 128 in every published size, whatever hidden_size / num_attention_heads
// is: Qwen3-0.6B's 16 heads x 128 = 2048 against a hidden size of 1024).
// Hugging Face's Qwen3ForCausalLM names its tensors as Llama does, plus
// self_attn.q_norm / k_norm. config.json's head_dim defaults to 128 as
// Qwen3Config's does. Sliding-window attention (use_sliding_window: true)
// is refused. In GGUF it is llama.cpp's "qwen3": Qwen2's names (q and k rows
// unpermuted: NEOX rotation, as Hugging Face's) without biases, plus
// blk.L.attn_q_norm / attn_k_norm [head_dim], the head size as
// qwen3.attention.key_length and value_length.
#include "core/limits.h"
#include "model/arch.h"

namespace nk {
namespace {

class Qwen3 final : public Architecture {
 public:
  std::string name() const override { return "qwen3"; }
  std::string display_name() const override { return "Qwen3"; }
  BlockSpec block() const override {
    BlockSpec s;
    s.rms_norm = true;
    s.swiglu = true;
    s.qk_norm = true;
    return s;
  }

  void add_presets(std::map<std::string, ModelConfig>& r) const override {
    ModelConfig c;
    c.arch = "qwen3";
    c.norm_eps = 1e-6;
    c.rope_theta = 1e6;
    c.tied_embeddings = true;
    // For tests, over bytes; a head size apart from d_model / n_head, as
    // the published ones have.
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.d_model = 64;
    c.attn_head_dim = 32;
    c.d_ff = 176;
    c.vocab_size = 257;
    c.max_seq_len = 256;
    r["qwen3-tiny"] = c;
    // Qwen3-0.6B's published shape.
    c.n_layer = 28;
    c.n_head = 16;
    c.n_kv_head = 8;
    c.d_model = 1024;
    c.attn_head_dim = 128;
    c.d_ff = 3072;
    c.vocab_size = 151936;
    c.max_seq_len = 40960;
    r["qwen3-0.6b"] = c;
  }

  std::vector<std::pair<std::string, std::string>> hf_classes() const override {
    return {{"Qwen3ForCausalLM", "qwen3"}};
  }

  void hf_read_config(const HfConfigReader& h, ModelConfig& c) const override {
    hf_read_llama_style(h, c, /*any_head_dim=*/true);
    if (!h.has("head_dim") && (c.d_model % c.n_head || c.d_model / c.n_head != 128))
      c.attn_head_dim = 128;  // Qwen3Config's default
    if (h.boolean("attention_bias", false))
      h.unsupported("attention_bias", "attention projections without biases only");
    if (h.boolean("use_sliding_window", false))
      h.unsupported("use_sliding_window", "sliding-window attention is not supported");
    if (h.has("layer_types")) {
      const nlohmann::json& t = h.at("layer_types");
      if (!t.is_array()) h.fail_at("field 'layer_types' must be a list, got " + t.dump());
      for (const nlohmann::json& x : t)
        if (x != "full_attention")
          h.unsupported("layer_types", "only full_attention layers are supported");
    }
  }

  void hf_write_config(const ModelConfig& c, nlohmann::ordered_json& j) const override {
    hf_write_llama_style(c, j);
    j["attention_bias"] = false;
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.n_layer;
    j["attention_dropout"] = 0.0;
  }

  std::vector<ExternalTensor> hf_tensors(const ModelConfig& c, const std::string&) const override {
    return llama_style_hf_tensors(c, false, /*qk_norm=*/true);
  }
  DType hf_default_dtype() const override { return DType::BF16; }  // as Qwen3's are published

  std::string gguf_arch() const override { return "qwen3"; }
  std::vector<ExternalTensor> gguf_tensors(const ModelConfig& c) const override {
    return llama_style_gguf_tensors(c, false, false, /*qk_norm=*/true);
  }
};

}  // namespace

const Architecture& qwen3_architecture() {
  static const Qwen3 a;
  return a;
}

}  // namespace nk
