// Gemma 3's text model (Gemma3ForCausalLM, model_type gemma3_text): Gemma
// 2's block (model/arch/gemma2.cc) with a (1 + w) RMSNorm over each head of
// q and k before the rotation (q_norm, k_norm), five local layers then one
// global (sliding_window_pattern 6, or the layer_types list), the local
// layers' own RoPE base rope_local_base_freq (10000, unscaled) while
// rope_theta (1e6) and rope_scaling (linear 8 in the 4B and larger) are the
// global layers', and no soft-capping unless the config sets it. The
// multimodal Gemma3ForConditionalGeneration is not read. GGUF export writes
// llama.cpp's gemma3 (model/arch/gemma2.cc gemma_gguf_tensors,
// ckpt/gguf_export.cc add_gemma).
#include "model/arch.h"

namespace nk {
namespace {

class Gemma3 final : public Architecture {
 public:
  std::string name() const override { return "gemma3"; }
  std::string display_name() const override { return "Gemma 3"; }
  BlockSpec block() const override { return gemma_block(true); }

  void add_presets(std::map<std::string, ModelConfig>& r) const override {
    ModelConfig c;
    c.arch = "gemma3";
    c.norm_eps = 1e-6;
    c.rope_theta = 1e6;
    c.rope_local_theta = 10000.0;
    c.tied_embeddings = true;
    c.sliding_window_pattern = 6;
    // For tests, over bytes: one global layer after five local ones.
    c.n_layer = 6;
    c.n_head = 4;
    c.n_kv_head = 1;
    c.d_model = 64;
    c.attn_head_dim = 32;
    c.query_pre_attn_scalar = 32;
    c.d_ff = 176;
    c.vocab_size = 257;
    c.max_seq_len = 256;
    c.sliding_window = 32;
    r["gemma3-tiny"] = c;
    // Gemma 3 1B's published shape.
    c.n_layer = 26;
    c.n_head = 4;
    c.n_kv_head = 1;
    c.d_model = 1152;
    c.attn_head_dim = 256;
    c.query_pre_attn_scalar = 256;
    c.d_ff = 6912;
    c.vocab_size = 262144;
    c.max_seq_len = 32768;
    c.sliding_window = 512;
    r["gemma3-1b"] = c;
  }

  std::vector<std::pair<std::string, std::string>> hf_classes() const override {
    return {{"Gemma3ForCausalLM", "gemma3_text"}};
  }
  void hf_read_config(const HfConfigReader& h, ModelConfig& c) const override {
    hf_read_gemma(h, c, true);
  }
  void hf_write_config(const ModelConfig& c, nlohmann::ordered_json& j) const override {
    hf_write_gemma(c, j, true);
  }
  std::vector<ExternalTensor> hf_tensors(const ModelConfig& c, const std::string&) const override {
    return gemma_hf_tensors(c, true);
  }
  DType hf_default_dtype() const override { return DType::BF16; }

  std::string gguf_arch() const override { return "gemma3"; }
  std::vector<ExternalTensor> gguf_tensors(const ModelConfig& c) const override {
    return gemma_gguf_tensors(c, true);
  }
};

}  // namespace

const Architecture& gemma3_architecture() {
  static const Gemma3 a;
  return a;
}

}  // namespace nk
