// Qwen2 (and Qwen2.5, which has the same architecture): Llama with biases on
// the q, k and v projections (not on the output projection, not in the MLP),
// published with rope_theta 1e6, rms_norm_eps 1e-6 and, in the small sizes,
// the head tied to the embedding. Hugging Face's Qwen2ForCausalLM names its
// tensors as Llama does; the q, k, v biases map to the fused QKV bias's parts.
// llama.cpp's "qwen2" architecture rotates with NEOX's rotate-half, Hugging
// Face's own convention, so GGUF keeps the q and k rows as they are (Llama's
// GGUF permutes them).
//
// Sliding-window attention (use_sliding_window: true, or layer_types naming
// sliding_attention) is refused; otherwise sliding_window and
// max_window_layers are ignored, as transformers ignores them.
#include "model/arch.h"

namespace nk {
namespace {

class Qwen2 final : public Architecture {
 public:
  std::string name() const override { return "qwen2"; }
  std::string display_name() const override { return "Qwen2"; }
  BlockSpec block() const override {
    BlockSpec s;
    s.rms_norm = true;
    s.swiglu = true;
    s.qkv_bias = true;
    return s;
  }

  void add_presets(std::map<std::string, ModelConfig>& r) const override {
    auto qwen2 = [](int64_t L, int64_t H, int64_t KV, int64_t C, int64_t F, int64_t V, int64_t T) {
      ModelConfig c;
      c.arch = "qwen2";
      c.n_layer = L;
      c.n_head = H;
      c.n_kv_head = KV;
      c.d_model = C;
      c.d_ff = F;
      c.vocab_size = V;
      c.max_seq_len = T;
      c.norm_eps = 1e-6;
      c.rope_theta = 1e6;
      c.tied_embeddings = true;
      return c;
    };
    r["qwen2-tiny"] = qwen2(2, 4, 2, 64, 176, 257, 256);  // for tests, over bytes
    // Qwen2.5-0.5B's published shape (Qwen2-0.5B's, with a 32k context).
    r["qwen2-0.5b"] = qwen2(24, 14, 2, 896, 4864, 151936, 32768);
  }

  std::vector<std::pair<std::string, std::string>> hf_classes() const override {
    return {{"Qwen2ForCausalLM", "qwen2"}};
  }

  void hf_read_config(const HfConfigReader& h, ModelConfig& c) const override {
    hf_read_llama_style(h, c);
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
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.n_layer;
    j["attention_dropout"] = 0.0;
  }

  std::vector<ExternalTensor> hf_tensors(const ModelConfig& c, const std::string&) const override {
    return llama_style_hf_tensors(c, true);
  }
  DType hf_default_dtype() const override { return DType::BF16; }  // as Qwen2's are published

  std::string gguf_arch() const override { return "qwen2"; }
  std::vector<ExternalTensor> gguf_tensors(const ModelConfig& c) const override {
    return llama_style_gguf_tensors(c, true, false);
  }
};

}  // namespace

const Architecture& qwen2_architecture() {
  static const Qwen2 a;
  return a;
}

}  // namespace nk
