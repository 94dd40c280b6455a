// Mistral: Llama's block with sliding-window attention (Mistral 7B v0.1: each
// token attends to the last 4096 positions; v0.2 and later publish
// `sliding_window: null`, full attention). The window is the attention's
// (ModelConfig::sliding_window), so training, packed rows and the KV cache all
// honour it. Hugging Face's MistralForCausalLM names its tensors as Llama does;
// llama.cpp runs Mistral as its "llama" architecture, which has no sliding
// window, so GGUF export refuses a window shorter than the context.
#include "model/arch.h"

namespace nk {
namespace {

class Mistral final : public Architecture {
 public:
  std::string name() const override { return "mistral"; }
  std::string display_name() const override { return "Mistral"; }
  BlockSpec block() const override {
    BlockSpec s;
    s.rms_norm = true;
    s.swiglu = true;
    return s;
  }

  void add_presets(std::map<std::string, ModelConfig>& r) const override {
    ModelConfig c;
    c.arch = "mistral";
    c.tied_embeddings = false;
    c.norm_eps = 1e-5;
    // For tests, over bytes: a window shorter than the context.
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.d_model = 64;
    c.d_ff = 176;
    c.vocab_size = 257;
    c.max_seq_len = 256;
    c.sliding_window = 64;
    r["mistral-tiny"] = c;
    // Mistral 7B v0.1's published shape.
    c.n_layer = 32;
    c.n_head = 32;
    c.n_kv_head = 8;
    c.d_model = 4096;
    c.d_ff = 14336;
    c.vocab_size = 32000;
    c.max_seq_len = 32768;
    c.sliding_window = 4096;
    r["mistral-7b"] = c;
  }

  std::vector<std::pair<std::string, std::string>> hf_classes() const override {
    return {{"MistralForCausalLM", "mistral"}};
  }

  void hf_read_config(const HfConfigReader& h, ModelConfig& c) const override {
    hf_read_llama_style(h, c);
    hf_read_sliding_window(h, c);
  }

  void hf_write_config(const ModelConfig& c, nlohmann::ordered_json& j) const override {
    hf_write_llama_style(c, j);
    hf_write_sliding_window(c, j);
    j["attention_dropout"] = 0.0;
  }

  std::vector<ExternalTensor> hf_tensors(const ModelConfig& c, const std::string&) const override {
    return llama_style_hf_tensors(c, false);
  }
  DType hf_default_dtype() const override { return DType::BF16; }  // as Mistral's are published

  std::string gguf_arch() const override { return "llama"; }
  std::vector<ExternalTensor> gguf_tensors(const ModelConfig& c) const override {
    return llama_style_gguf_tensors(c, false, true);
  }
  bool gguf_rope_freqs() const override { return true; }
};

}  // namespace

const Architecture& mistral_architecture() {
  static const Mistral a;
  return a;
}

}  // namespace nk
