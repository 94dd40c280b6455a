// Gemma 2 (Gemma2ForCausalLM): Llama's projections with Gemma's block
// features, each a general one of BlockSpec / ModelConfig: GeGLU with the
// tanh GELU (hidden_activation gelu_pytorch_tanh), RMSNorms scaling by
// (1 + w) in f32, norms before and after both sub-blocks (input_layernorm,
// post_attention_layernorm on the attention's output, pre_feedforward_layernorm,
// post_feedforward_layernorm on the MLP's output), the embeddings times
// sqrt(hidden_size), attention scores scaled by 1/sqrt(query_pre_attn_scalar)
// and soft-capped (attn_logit_softcapping), the logits soft-capped
// (final_logit_softcapping), head_dim apart from hidden / heads (256 in
// every published size), and local (sliding_window) layers alternating with
// global ones, layer 0 local. The head is tied to the embedding. This file
// also holds the config.json keys and tensor names Gemma 3 shares
// (hf_read_gemma, hf_write_gemma, gemma_hf_tensors, gemma_gguf_tensors).
// GGUF export writes llama.cpp's gemma2 (ckpt/gguf_export.cc add_gemma: the
// soft-capping and window keys, and what llama.cpp's graph cannot run).
#include "core/limits.h"
#include "model/arch.h"

namespace nk {
namespace {

class Gemma2 final : public Architecture {
 public:
  std::string name() const override { return "gemma2"; }
  std::string display_name() const override { return "Gemma 2"; }
  BlockSpec block() const override { return gemma_block(false); }

  void add_presets(std::map<std::string, ModelConfig>& r) const override {
    ModelConfig c;
    c.arch = "gemma2";
    c.norm_eps = 1e-6;
    c.rope_theta = 10000.0;
    c.tied_embeddings = true;
    c.sliding_window_pattern = 2;
    c.attn_logit_softcap = 50.0;
    c.final_logit_softcap = 30.0;
    // For tests, over bytes: a window shorter than the context, heads of
    // their own size.
    c.n_layer = 4;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.d_model = 64;
    c.attn_head_dim = 32;
    c.query_pre_attn_scalar = 32;
    c.d_ff = 176;
    c.vocab_size = 257;
    c.max_seq_len = 256;
    c.sliding_window = 32;
    r["gemma2-tiny"] = c;
    // Gemma 2 2B's published shape.
    c.n_layer = 26;
    c.n_head = 8;
    c.n_kv_head = 4;
    c.d_model = 2304;
    c.attn_head_dim = 256;
    c.query_pre_attn_scalar = 256;
    c.d_ff = 9216;
    c.vocab_size = 256000;
    c.max_seq_len = 8192;
    c.sliding_window = 4096;
    r["gemma2-2b"] = c;
  }

  std::vector<std::pair<std::string, std::string>> hf_classes() const override {
    return {{"Gemma2ForCausalLM", "gemma2"}};
  }
  void hf_read_config(const HfConfigReader& h, ModelConfig& c) const override {
    hf_read_gemma(h, c, false);
  }
  void hf_write_config(const ModelConfig& c, nlohmann::ordered_json& j) const override {
    hf_write_gemma(c, j, false);
  }
  std::vector<ExternalTensor> hf_tensors(const ModelConfig& c, const std::string&) const override {
    return gemma_hf_tensors(c, false);
  }
  DType hf_default_dtype() const override { return DType::BF16; }

  std::string gguf_arch() const override { return "gemma2"; }
  std::vector<ExternalTensor> gguf_tensors(const ModelConfig& c) const override {
    return gemma_gguf_tensors(c, false);
  }
};

// Gemma's layer_types list as a pattern P (ModelConfig::sliding_window_pattern):
// layer l global iff (l + 1) % P == 0; 0 when every layer is local, -1 when
// every layer is global. nk::Error naming the key for any other list.
int64_t pattern_of_layer_types(const HfConfigReader& h, int64_t n_layer) {
  const nlohmann::json& t = h.at("layer_types");
  if (!t.is_array() || int64_t(t.size()) != n_layer)
    h.fail_at(
        fmt::format("field 'layer_types' must list the {} layers, got {}", n_layer, t.dump()));
  int64_t first_global = -1;
  for (int64_t l = 0; l < n_layer; ++l) {
    const nlohmann::json& x = t[size_t(l)];
    if (x != "sliding_attention" && x != "full_attention")
      h.fail_at(
          fmt::format("field 'layer_types' entry {} is {}: expected \"sliding_attention\" "
                      "or \"full_attention\"",
                      l, x.dump()));
    if (x == "full_attention" && first_global < 0) first_global = l;
  }
  const int64_t P = first_global < 0 ? 0 : first_global + 1;
  if (P == 1) {
    for (const nlohmann::json& x : t)
      if (x != "full_attention")
        h.unsupported("layer_types", "local layers must repeat in a fixed pattern");
    return -1;
  }
  for (int64_t l = 0; l < n_layer; ++l) {
    const bool global = P > 0 && (l + 1) % P == 0;
    if ((t[size_t(l)] == "full_attention") != global)
      h.unsupported("layer_types",
                    fmt::format("every {}-th layer global, the others local, is what is "
                                "supported (layer {} differs)",
                                P, l));
  }
  return P;
}

}  // namespace

BlockSpec gemma_block(bool qk_norm) {
  BlockSpec s;
  s.rms_norm = true;
  s.swiglu = true;
  s.gelu_gate = true;
  s.norm_offset = true;
  s.post_norms = true;
  s.embed_scale = true;
  s.qk_norm = qk_norm;
  return s;
}

void hf_read_gemma(const HfConfigReader& h, ModelConfig& c, bool gemma3) {
  c.d_model = h.positive("hidden_size", limits::kHidden, "hidden units");
  c.d_ff = h.positive("intermediate_size", limits::kFfn, "MLP units");
  c.n_layer = h.positive("num_hidden_layers", limits::kLayers, "layers");
  c.n_head = h.positive("num_attention_heads", limits::kHeads, "heads");
  c.n_kv_head = h.has("num_key_value_heads")
                    ? h.positive("num_key_value_heads", limits::kHeads, "heads")
                    : c.n_head;
  if (c.n_head % c.n_kv_head)
    h.fail_at(fmt::format("'num_key_value_heads' = {} does not divide 'num_attention_heads' = {}",
                          c.n_kv_head, c.n_head));
  c.vocab_size = h.positive("vocab_size", limits::kVocab, "token ids");
  c.max_seq_len = h.positive("max_position_embeddings", limits::kSeqLen, "positions");
  c.norm_eps = h.number("rms_norm_eps", 1e-6);
  rope_from_hf_config(h.object(), h.where(), c.rope_theta, c.rope_scaling);
  if (!h.has("rope_theta")) c.rope_theta = gemma3 ? 1e6 : 10000.0;  // the configs' defaults
  c.tied_embeddings = h.boolean("tie_word_embeddings", true);
  c.init_std = h.number("initializer_range", 0.02);
  // head_dim: 256 by default (Gemma2Config's and Gemma3TextConfig's).
  const int64_t D = h.has("head_dim") ? h.positive("head_dim", limits::kHidden, "units") : 256;
  c.attn_head_dim = c.d_model % c.n_head == 0 && D == c.d_model / c.n_head ? 0 : D;
  // gelu_pytorch_tanh and gelu_new are the same tanh form; hidden_activation wins.
  const char* act_key = h.has("hidden_activation") ? "hidden_activation" : "hidden_act";
  const std::string act = h.string(act_key, "gelu_pytorch_tanh");
  if (act != "gelu_pytorch_tanh" && act != "gelu_new")
    h.unsupported(act_key, "only gelu_pytorch_tanh (GeGLU with the tanh GELU) is supported");
  if (h.boolean("attention_bias", false))
    h.unsupported("attention_bias", "attention projections without biases only");
  c.query_pre_attn_scalar = h.number("query_pre_attn_scalar", 256.0);
  // Absent: the class's default (Gemma 2 caps, Gemma 3 does not); null: none.
  auto softcap = [&](const char* key, double def) {
    const nlohmann::json& j = h.object();
    return j.contains(key) && j.at(key).is_null() ? 0.0 : h.number(key, def);
  };
  c.attn_logit_softcap = softcap("attn_logit_softcapping", gemma3 ? 0.0 : 50.0);
  c.final_logit_softcap = softcap("final_logit_softcapping", gemma3 ? 0.0 : 30.0);
  c.sliding_window =
      h.has("sliding_window") ? h.positive("sliding_window", limits::kSeqLen, "positions") : 4096;
  int64_t P = gemma3 ? h.integer("sliding_window_pattern", 6) : 2;
  if (h.has("layer_types")) P = pattern_of_layer_types(h, c.n_layer);
  if (P < 0) {  // every layer global
    c.sliding_window = 0;
    P = 0;
  }
  if (P == 1) h.unsupported("sliding_window_pattern", "1 would make every layer global");
  c.sliding_window_pattern = P;
  c.rope_local_theta = 0.0;
  if (gemma3 && c.sliding_window > 0)
    c.rope_local_theta = h.number("rope_local_base_freq", 10000.0);
}

void hf_write_gemma(const ModelConfig& c, nlohmann::ordered_json& j, bool gemma3) {
  j["hidden_size"] = c.d_model;
  j["intermediate_size"] = c.d_ff;
  j["num_hidden_layers"] = c.n_layer;
  j["num_attention_heads"] = c.n_head;
  j["num_key_value_heads"] = c.n_kv_head;
  j["head_dim"] = c.head_dim();
  j["hidden_activation"] = "gelu_pytorch_tanh";
  j["hidden_act"] = "gelu_pytorch_tanh";
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = rope_scaling_to_hf(c.rope_scaling);
  if (gemma3) j["rope_local_base_freq"] = c.rope_local_theta > 0 ? c.rope_local_theta : 10000.0;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["query_pre_attn_scalar"] =
      c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : double(c.head_dim());
  auto cap = [](double v) { return v > 0 ? nlohmann::ordered_json(v) : nlohmann::ordered_json(); };
  j["attn_logit_softcapping"] = cap(c.attn_logit_softcap);
  j["final_logit_softcapping"] = cap(c.final_logit_softcap);
  // No window: a window over the whole context, every layer global alike.
  j["sliding_window"] = c.sliding_window > 0 ? c.sliding_window : c.max_seq_len;
  if (gemma3) j["sliding_window_pattern"] = c.sliding_window_pattern;
  nlohmann::ordered_json types = nlohmann::ordered_json::array();
  for (int64_t l = 0; l < c.n_layer; ++l)
    types.push_back(c.layer_local(l) ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
}

std::vector<ExternalTensor> gemma_hf_tensors(const ModelConfig& c, bool qk_norm) {
  std::vector<ExternalTensor> out;
  auto one = [&](const std::string& param, const std::string& hf, const std::string& part = "") {
    out.push_back({hf, param, part, false, 0});
  };
  one("wte", "model.embed_tokens.weight");
  for (int64_t l = 0; l < c.n_layer; ++l) {
    std::string h = fmt::format("h.{}.", l), m = fmt::format("model.layers.{}.", l);
    one(h + "ln1.weight", m + "input_layernorm.weight");
    for (const char* x : {"q", "k", "v"})
      one(h + "attn.qkv.weight", m + "self_attn." + x + "_proj.weight", x);
    if (qk_norm) {
      one(h + "attn.q_norm.weight", m + "self_attn.q_norm.weight");
      one(h + "attn.k_norm.weight", m + "self_attn.k_norm.weight");
    }
    one(h + "attn.proj.weight", m + "self_attn.o_proj.weight");
    one(h + "ln_attn_out.weight", m + "post_attention_layernorm.weight");
    one(h + "ln2.weight", m + "pre_feedforward_layernorm.weight");
    one(h + "mlp.up.weight", m + "mlp.gate_proj.weight", "gate");
    one(h + "mlp.up.weight", m + "mlp.up_proj.weight", "up");
    one(h + "mlp.down.weight", m + "mlp.down_proj.weight");
    one(h + "ln_mlp_out.weight", m + "post_feedforward_layernorm.weight");
  }
  one("ln_f.weight", "model.norm.weight");
  if (!c.tied_embeddings) one("lm_head.weight", "lm_head.weight");
  return out;
}

std::vector<ExternalTensor> gemma_gguf_tensors(const ModelConfig& c, bool qk_norm) {
  std::vector<ExternalTensor> out;
  auto one = [&](const std::string& param, const std::string& name, const std::string& part = "") {
    out.push_back({name, param, part, false, 0});
  };
  auto norm = [&](const std::string& param, const std::string& name) {
    out.push_back({name, param, "", false, 0});
    out.back().add = 1.0f;
  };
  one("wte", "token_embd.weight");
  for (int64_t l = 0; l < c.n_layer; ++l) {
    std::string h = fmt::format("h.{}.", l), b = fmt::format("blk.{}.", l);
    norm(h + "ln1.weight", b + "attn_norm.weight");
    for (const char* x : {"q", "k", "v"})
      one(h + "attn.qkv.weight", b + "attn_" + x + ".weight", x);
    if (qk_norm) {
      norm(h + "attn.q_norm.weight", b + "attn_q_norm.weight");
      norm(h + "attn.k_norm.weight", b + "attn_k_norm.weight");
    }
    one(h + "attn.proj.weight", b + "attn_output.weight");
    norm(h + "ln_attn_out.weight", b + "post_attention_norm.weight");
    norm(h + "ln2.weight", b + "ffn_norm.weight");
    one(h + "mlp.up.weight", b + "ffn_gate.weight", "gate");
    one(h + "mlp.up.weight", b + "ffn_up.weight", "up");
    one(h + "mlp.down.weight", b + "ffn_down.weight");
    norm(h + "ln_mlp_out.weight", b + "post_ffw_norm.weight");
  }
  norm("ln_f.weight", "output_norm.weight");
  // The map covers an untied head as llama.cpp names it; export refuses one
  // (gguf_export.cc add_gemma: llama.cpp's gemma2 graph reads the embedding).
  if (!c.tied_embeddings) one("lm_head.weight", "output.weight");
  return out;
}

const Architecture& gemma2_architecture() {
  static const Gemma2 a;
  return a;
}

}  // namespace nk
