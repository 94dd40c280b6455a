// GPT-2: LayerNorm with biases, GELU MLP, learned positions, biases on every
// projection, multi-head attention. Hugging Face's GPT2LMHeadModel stores its
// projections as Conv1D ([in, out]), so every matrix is transposed there.
// llama.cpp's "gpt2" keeps the fused QKV projection as one tensor whose rows
// are [q; k; v], as Nekton's are, and every matrix [out, in] as Nekton does.
#include "core/limits.h"
#include "model/arch.h"

namespace nk {
namespace {

class Gpt2 final : public Architecture {
 public:
  std::string name() const override { return "gpt2"; }
  std::string display_name() const override { return "GPT-2"; }
  BlockSpec block() const override {
    BlockSpec s;
    s.learned_positions = true;
    s.qkv_bias = true;
    s.proj_bias = true;
    return s;
  }

  void add_presets(std::map<std::string, ModelConfig>& r) const override {
    auto gpt2 = [](int64_t L, int64_t H, int64_t C) {
      ModelConfig c;
      c.arch = "gpt2";
      c.n_layer = L;
      c.n_head = c.n_kv_head = H;
      c.d_model = C;
      c.d_ff = 4 * C;
      return c;
    };
    r["gpt2-124m"] = gpt2(12, 12, 768);
    r["gpt2-355m"] = gpt2(24, 16, 1024);
    r["gpt2-774m"] = gpt2(36, 20, 1280);
    r["gpt2-1.5b"] = gpt2(48, 25, 1600);
    ModelConfig tiny = gpt2(4, 4, 256);  // the quickstart model over bytes
    tiny.vocab_size = 257;
    tiny.max_seq_len = 256;
    r["gpt-tiny"] = tiny;
  }

  // GPT-2's MLP is 4 d_model wide (Hugging Face's n_inner default).
  int64_t derived_d_ff(const ModelConfig&, int64_t d_model, std::string& rule) const override {
    rule = "4 d_model (GPT-2's n_inner)";
    return 4 * d_model;
  }

  void validate(const ModelConfig& c, const std::string& p) const override {
    if (c.n_kv_head != c.n_head)
      fail("{}n_kv_head: gpt2 uses multi-head attention (n_kv_head must equal n_head)", p);
  }

  std::vector<std::pair<std::string, std::string>> hf_classes() const override {
    return {{"GPT2LMHeadModel", "gpt2"}};
  }
  std::string hf_classifier_class() const override { return "GPT2ForSequenceClassification"; }

  void hf_read_config(const HfConfigReader& h, ModelConfig& c) const override {
    c.d_model = h.positive("n_embd", limits::kHidden, "hidden units");
    c.n_layer = h.positive("n_layer", limits::kLayers, "layers");
    c.n_head = c.n_kv_head = h.positive("n_head", limits::kHeads, "heads");
    c.vocab_size = h.positive("vocab_size", limits::kVocab, "token ids");
    c.max_seq_len = h.has("n_positions") || !h.has("n_ctx")
                        ? h.positive("n_positions", limits::kSeqLen, "positions")
                        : h.positive("n_ctx", limits::kSeqLen, "positions");
    c.d_ff = h.has("n_inner") ? h.positive("n_inner", limits::kFfn, "MLP units") : 4 * c.d_model;
    c.norm_eps = h.number("layer_norm_epsilon", 1e-5);
    c.tied_embeddings = h.boolean("tie_word_embeddings", true);
    c.init_std = h.number("initializer_range", 0.02);
    if (c.d_model % c.n_head)
      h.fail_at(fmt::format("'n_head' = {} does not divide 'n_embd' = {}", c.n_head, c.d_model));
    std::string act = h.string("activation_function", "gelu_new");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu_fast")
      h.unsupported("activation_function",
                    "only the tanh approximation of GELU (gelu_new) is supported");
    if (!h.boolean("scale_attn_weights", true))
      h.unsupported("scale_attn_weights",
                    "attention scores are always scaled by 1/sqrt(head size)");
    if (h.boolean("scale_attn_by_inverse_layer_idx", false))
      h.unsupported("scale_attn_by_inverse_layer_idx",
                    "per-layer attention scaling is not supported");
    if (h.boolean("add_cross_attention", false))
      h.unsupported("add_cross_attention", "decoder-only models only");
  }

  void hf_write_config(const ModelConfig& c, nlohmann::ordered_json& j) const override {
    j["n_embd"] = c.d_model;
    j["n_layer"] = c.n_layer;
    j["n_head"] = c.n_head;
    j["n_inner"] = c.d_ff;
    j["n_positions"] = c.max_seq_len;
    j["n_ctx"] = c.max_seq_len;
    j["activation_function"] = "gelu_new";
    j["layer_norm_epsilon"] = c.norm_eps;
    j["scale_attn_weights"] = true;
    j["scale_attn_by_inverse_layer_idx"] = false;
    j["reorder_and_upcast_attn"] = false;
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    j["attn_pdrop"] = 0.0;
  }

  std::vector<ExternalTensor> hf_tensors(const ModelConfig& c,
                                         const std::string& p) const override {
    std::vector<ExternalTensor> out;
    auto one = [&](const std::string& param, const std::string& hf, bool t = false) {
      out.push_back({hf, param, "", t, 0});
    };
    one("wte", p + "wte.weight");
    one("wpe", p + "wpe.weight");
    for (int64_t l = 0; l < c.n_layer; ++l) {
      std::string h = fmt::format("h.{}.", l), g = fmt::format("{}h.{}.", p, l);
      one(h + "ln1.weight", g + "ln_1.weight");
      one(h + "ln1.bias", g + "ln_1.bias");
      one(h + "attn.qkv.weight", g + "attn.c_attn.weight", true);
      one(h + "attn.qkv.bias", g + "attn.c_attn.bias");
      one(h + "attn.proj.weight", g + "attn.c_proj.weight", true);
      one(h + "attn.proj.bias", g + "attn.c_proj.bias");
      one(h + "ln2.weight", g + "ln_2.weight");
      one(h + "ln2.bias", g + "ln_2.bias");
      one(h + "mlp.up.weight", g + "mlp.c_fc.weight", true);
      one(h + "mlp.up.bias", g + "mlp.c_fc.bias");
      one(h + "mlp.down.weight", g + "mlp.c_proj.weight", true);
      one(h + "mlp.down.bias", g + "mlp.c_proj.bias");
    }
    one("ln_f.weight", p + "ln_f.weight");
    one("ln_f.bias", p + "ln_f.bias");
    if (!c.tied_embeddings) one("lm_head.weight", "lm_head.weight");
    return out;
  }
  std::string hf_tensor_prefix() const override { return "transformer."; }
  DType hf_default_dtype() const override { return DType::F32; }  // as GPT-2's are published

  std::string gguf_arch() const override { return "gpt2"; }
  std::vector<ExternalTensor> gguf_tensors(const ModelConfig& c) const override {
    std::vector<ExternalTensor> out;
    auto one = [&](const std::string& param, const std::string& name) {
      out.push_back({name, param, "", false, 0});
    };
    auto with_bias = [&](const std::string& param, const std::string& name) {
      one(param + ".weight", name + ".weight");
      one(param + ".bias", name + ".bias");
    };
    one("wte", "token_embd.weight");
    one("wpe", "position_embd.weight");
    for (int64_t l = 0; l < c.n_layer; ++l) {
      std::string h = fmt::format("h.{}.", l), b = fmt::format("blk.{}.", l);
      with_bias(h + "ln1", b + "attn_norm");
      with_bias(h + "attn.qkv", b + "attn_qkv");
      with_bias(h + "attn.proj", b + "attn_output");
      with_bias(h + "ln2", b + "ffn_norm");
      with_bias(h + "mlp.up", b + "ffn_up");
      with_bias(h + "mlp.down", b + "ffn_down");
    }
    with_bias("ln_f", "output_norm");
    // Tied: llama.cpp falls back to token_embd for the output projection.
    if (!c.tied_embeddings) one("lm_head.weight", "output.weight");
    return out;
  }
};

}  // namespace

const Architecture& gpt2_architecture() {
  static const Gpt2 a;
  return a;
}

}  // namespace nk
