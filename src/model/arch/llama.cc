// Llama: RMSNorm, SwiGLU MLP with a fused [gate | up] projection, rotary
// embeddings (Hugging Face's rotate-half), grouped-query attention, no biases.
// Hugging Face stores q, k, v and gate, up as separate tensors: they map to
// the fused parts. llama.cpp's "llama" rope rotates adjacent pairs (Meta's
// layout), so GGUF stores the q and k rows permuted within each head.
// RoPE scaling (Llama 3.1's "llama3" and the others) is the position
// encoding's, in model/rope.h; this file reads and writes its HF keys through
// hf_read_llama_style, which the other Llama-style families share.
#include "core/limits.h"
#include "model/arch.h"

namespace nk {
namespace {

class Llama final : public Architecture {
 public:
  std::string name() const override { return "llama"; }
  std::string display_name() const override { return "Llama"; }
  BlockSpec block() const override {
    BlockSpec s;
    s.rms_norm = true;
    s.swiglu = true;
    return s;
  }

  void add_presets(std::map<std::string, ModelConfig>& r) const override {
    auto llama = [](int64_t L, int64_t H, int64_t KV, int64_t C, int64_t F, int64_t V,
                    double theta) {
      ModelConfig c;
      c.arch = "llama";
      c.n_layer = L;
      c.n_head = H;
      c.n_kv_head = KV;
      c.d_model = C;
      c.d_ff = F;
      c.vocab_size = V;
      c.rope_theta = theta;
      c.tied_embeddings = false;
      return c;
    };
    ModelConfig lt = llama(2, 4, 2, 64, 176, 257, 10000.0);
    lt.max_seq_len = 256;
    r["llama-tiny"] = lt;
    // Llama 3.2 1B ties its head to the embedding; 7B does not.
    ModelConfig l1 = llama(16, 32, 8, 2048, 8192, 128256, 500000.0);
    l1.max_seq_len = 131072;
    l1.tied_embeddings = true;
    r["llama-1b"] = l1;
    ModelConfig l7 = llama(32, 32, 32, 4096, 11008, 32000, 10000.0);
    l7.max_seq_len = 4096;
    r["llama2-7b"] = l7;
  }

  std::vector<std::pair<std::string, std::string>> hf_classes() const override {
    return {{"LlamaForCausalLM", "llama"}};
  }

  void hf_read_config(const HfConfigReader& h, ModelConfig& c) const override {
    hf_read_llama_style(h, c);
    if (h.boolean("attention_bias", false))
      h.unsupported("attention_bias", "attention projections without biases only");
    if (h.boolean("mlp_bias", false))
      h.unsupported("mlp_bias", "MLP projections without biases only");
    if (h.has("sliding_window") && h.integer("sliding_window") < c.max_seq_len)
      h.unsupported("sliding_window",
                    fmt::format("sliding-window attention is not supported (a window of at least "
                                "max_position_embeddings = {} is full attention)",
                                c.max_seq_len));
  }

  void hf_write_config(const ModelConfig& c, nlohmann::ordered_json& j) const override {
    hf_write_llama_style(c, j);
    j["attention_bias"] = false;
    j["attention_dropout"] = 0.0;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }

  std::vector<ExternalTensor> hf_tensors(const ModelConfig& c, const std::string&) const override {
    return llama_style_hf_tensors(c, false);
  }
  DType hf_default_dtype() const override { return DType::BF16; }  // as Llama's are published

  std::string gguf_arch() const override { return "llama"; }
  std::vector<ExternalTensor> gguf_tensors(const ModelConfig& c) const override {
    return llama_style_gguf_tensors(c, false, true);
  }
  bool gguf_rope_freqs() const override { return true; }
};

}  // namespace

void hf_read_llama_style(const HfConfigReader& h, ModelConfig& c, bool any_head_dim) {
  c.d_model = h.positive("hidden_size", limits::kHidden, "hidden units");
  c.d_ff = h.positive("intermediate_size", limits::kFfn, "MLP units");
  c.n_layer = h.positive("num_hidden_layers", limits::kLayers, "layers");
  c.n_head = h.positive("num_attention_heads", limits::kHeads, "heads");
  c.n_kv_head = h.has("num_key_value_heads")
                    ? h.positive("num_key_value_heads", limits::kHeads, "heads")
                    : c.n_head;
  c.vocab_size = h.positive("vocab_size", limits::kVocab, "token ids");
  c.max_seq_len = h.positive("max_position_embeddings", limits::kSeqLen, "positions");
  c.norm_eps = h.number("rms_norm_eps", 1e-6);
  rope_from_hf_config(h.object(), h.where(), c.rope_theta, c.rope_scaling);
  c.tied_embeddings = h.boolean("tie_word_embeddings", false);
  c.init_std = h.number("initializer_range", 0.02);
  const bool head_dim_given = any_head_dim && h.has("head_dim");
  if (!head_dim_given && c.d_model % c.n_head)
    h.fail_at(fmt::format("'num_attention_heads' = {} does not divide 'hidden_size' = {}", c.n_head,
                          c.d_model));
  if (c.n_head % c.n_kv_head)
    h.fail_at(fmt::format("'num_key_value_heads' = {} does not divide 'num_attention_heads' = {}",
                          c.n_kv_head, c.n_head));
  c.attn_head_dim = 0;
  if (head_dim_given) {
    const int64_t d = h.positive("head_dim", limits::kHidden, "units");
    if (c.d_model % c.n_head || d != c.d_model / c.n_head) c.attn_head_dim = d;
  } else if (h.has("head_dim") && h.integer("head_dim") != c.d_model / c.n_head)
    h.unsupported("head_dim", fmt::format("Nekton needs hidden_size / num_attention_heads = {}",
                                          c.d_model / c.n_head));
  if (h.string("hidden_act", "silu") != "silu")
    h.unsupported("hidden_act", "only silu (SwiGLU) is supported");
}

void hf_write_llama_style(const ModelConfig& c, nlohmann::ordered_json& j) {
  j["hidden_size"] = c.d_model;
  j["intermediate_size"] = c.d_ff;
  j["num_hidden_layers"] = c.n_layer;
  j["num_attention_heads"] = c.n_head;
  j["num_key_value_heads"] = c.n_kv_head;
  j["head_dim"] = c.head_dim();
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = rope_scaling_to_hf(c.rope_scaling);
}

void hf_read_sliding_window(const HfConfigReader& h, ModelConfig& c) {
  c.sliding_window =
      h.has("sliding_window") ? h.positive("sliding_window", INT64_MAX, "positions") : 0;
  if (c.sliding_window >= c.max_seq_len) c.sliding_window = 0;
}

void hf_write_sliding_window(const ModelConfig& c, nlohmann::ordered_json& j) {
  j["sliding_window"] = c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window)
                                             : nlohmann::ordered_json(nullptr);
}

std::vector<ExternalTensor> llama_style_hf_tensors(const ModelConfig& c, bool qkv_bias,
                                                   bool qk_norm) {
  std::vector<ExternalTensor> out;
  auto one = [&](const std::string& param, const std::string& hf, const std::string& part = "") {
    out.push_back({hf, param, part, false, 0});
  };
  one("wte", "model.embed_tokens.weight");
  for (int64_t l = 0; l < c.n_layer; ++l) {
    std::string h = fmt::format("h.{}.", l), m = fmt::format("model.layers.{}.", l);
    one(h + "ln1.weight", m + "input_layernorm.weight");
    // The parts of one parameter are consecutive: weights, then biases.
    for (const char* w : {"weight", "bias"})
      for (const char* x : {"q", "k", "v"})
        if (w[0] == 'w' || qkv_bias)
          one(h + "attn.qkv." + w, m + "self_attn." + x + "_proj." + w, x);
    if (qk_norm) {
      one(h + "attn.q_norm.weight", m + "self_attn.q_norm.weight");
      one(h + "attn.k_norm.weight", m + "self_attn.k_norm.weight");
    }
    one(h + "attn.proj.weight", m + "self_attn.o_proj.weight");
    one(h + "ln2.weight", m + "post_attention_layernorm.weight");
    one(h + "mlp.up.weight", m + "mlp.gate_proj.weight", "gate");
    one(h + "mlp.up.weight", m + "mlp.up_proj.weight", "up");
    one(h + "mlp.down.weight", m + "mlp.down_proj.weight");
  }
  one("ln_f.weight", "model.norm.weight");
  if (!c.tied_embeddings) one("lm_head.weight", "lm_head.weight");
  return out;
}

std::vector<ExternalTensor> llama_style_gguf_tensors(const ModelConfig& c, bool qkv_bias,
                                                     bool rope_permute, bool qk_norm) {
  std::vector<ExternalTensor> out;
  auto one = [&](const std::string& param, const std::string& name, const std::string& part = "",
                 int64_t rope_heads = 0) {
    out.push_back({name, param, part, false, rope_heads});
  };
  one("wte", "token_embd.weight");
  for (int64_t l = 0; l < c.n_layer; ++l) {
    std::string h = fmt::format("h.{}.", l), b = fmt::format("blk.{}.", l);
    one(h + "ln1.weight", b + "attn_norm.weight");
    for (const char* w : {"weight", "bias"}) {
      if (w[0] == 'b' && !qkv_bias) continue;
      const bool permute = rope_permute && w[0] == 'w';
      one(h + "attn.qkv." + w, b + "attn_q." + w, "q", permute ? c.n_head : 0);
      one(h + "attn.qkv." + w, b + "attn_k." + w, "k", permute ? c.n_kv_head : 0);
      one(h + "attn.qkv." + w, b + "attn_v." + w, "v");
    }
    if (qk_norm) {
      one(h + "attn.q_norm.weight", b + "attn_q_norm.weight");
      one(h + "attn.k_norm.weight", b + "attn_k_norm.weight");
    }
    one(h + "attn.proj.weight", b + "attn_output.weight");
    one(h + "ln2.weight", b + "ffn_norm.weight");
    one(h + "mlp.up.weight", b + "ffn_gate.weight", "gate");
    one(h + "mlp.up.weight", b + "ffn_up.weight", "up");
    one(h + "mlp.down.weight", b + "ffn_down.weight");
  }
  one("ln_f.weight", "output_norm.weight");
  // Tied: llama.cpp falls back to token_embd for the output projection.
  if (!c.tied_embeddings) one("lm_head.weight", "output.weight");
  return out;
}

const Architecture& llama_architecture() {
  static const Llama a;
  return a;
}

}  // namespace nk
