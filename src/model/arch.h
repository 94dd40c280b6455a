// Everything that differs between the decoder-only architectures Nekton
// knows, behind one interface: each architecture is one file in
// src/model/arch/ (gpt2.cc, llama.cc, ...) that owns its presets, its block's
// choices (norm, MLP, positions, biases), its parameter layout, its Hugging
// Face config.json keys and tensor names, and its GGUF names. The rest of the
// code asks the model's Architecture; it never tests an architecture's name.
//
// Adding one: a new file src/model/arch/NAME.cc defining a subclass and a
// `const Architecture& NAME_architecture()`, plus its line in arch.cc's
// registry (a static library drops self-registering objects nobody
// references, so the registry names each one).
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/model_config.h"
#include "nn/param_layout.h"

namespace nk {

// The per-block choices the shared nn blocks need.
struct BlockSpec {
  bool rms_norm = false;           // RMSNorm (no bias) instead of LayerNorm (+ bias)
  bool swiglu = false;             // a gated MLP over a fused [gate | up] projection, else GELU
  bool gelu_gate = false;          // the gated MLP's gate through the tanh GELU (GeGLU), not SiLU
  bool learned_positions = false;  // a wpe table (GPT-2), else rotary embeddings
  bool qkv_bias = false;           // bias on the fused QKV projection
  bool proj_bias = false;          // biases on the attention output and both MLP projections
  // Per-head RMSNorms on q and k before the rotation (Qwen3): weights
  // h.L.attn.q_norm.weight and h.L.attn.k_norm.weight [head_dim].
  bool qk_norm = false;
  // Gemma's RMSNorms scale by (1 + w), the weights stored centred at 0
  // (initialised to 0), computed in f32; every norm of the model, q/k norms
  // included.
  bool norm_offset = false;
  // Norms on the sub-blocks' outputs too (Gemma 2 and 3): x + post(attn(ln1
  // x)), then + post_ffn(mlp(ln2 x)); weights h.L.ln_attn_out.weight and
  // h.L.ln_mlp_out.weight [C].
  bool post_norms = false;
  // The token embeddings times sqrt(d_model), the factor rounded to the
  // compute dtype first (Gemma, as HF's normalizer).
  bool embed_scale = false;
  // Multi-head Latent Attention (DeepSeek-V2/V3, nn/latent_attention.h) in
  // place of the fused QKV: per layer h.L.attn.q.weight [H D, C] (no
  // q_lora_rank) or h.L.attn.q_a.weight [q_rank, C], q_a_norm.weight
  // [q_rank] and q_b.weight [H D, q_rank]; h.L.attn.kv_a.weight [kv_rank +
  // rope, C], kv_a_norm.weight [kv_rank], kv_b.weight [H (nope + v), kv_rank];
  // attn.proj.weight [C, H v] (ModelConfig::kv_lora_rank and the rest).
  bool latent_attention = false;
};

// One tensor of an external checkpoint (HF or GGUF) and where it lives in
// Nekton's layout: a whole parameter or one fused part of it.
struct ExternalTensor {
  std::string name;         // external name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::string param;        // Nekton parameter, e.g. "h.0.attn.qkv.weight"
  std::string part;         // fused part ("q"), or "" for the whole parameter
  bool transposed = false;  // stored [in, out] (GPT-2's Conv1D)
  int64_t rope_heads = 0;   // > 0: rows permuted to llama.cpp's rotary order over so many heads
  // > 0 (GGUF's expert tensors): a 3-d tensor [experts, rows, in] whose
  // slice e is the part named `part` with "{}" replaced by e (llama.cpp's
  // ffn_{gate,up,down}_exps stack the experts of a layer).
  int64_t experts = 0;
  // A [1, in] parameter stored as a 1-d tensor [in] (llama.cpp's
  // ffn_gate_inp_shexp, Qwen2-MoE's shared-expert gate).
  bool flat = false;
  // GGUF: added to every element as written (Gemma's (1 + w) norms: llama.cpp's
  // gemma2/gemma3 graphs scale by the stored weight itself, so w + 1 is stored).
  float add = 0;
  // > 0 (GGUF's split kv_b of Multi-head Latent Attention, llama.cpp's
  // attn_k_b / attn_v_b): a 3-d tensor whose slice h of head_split holds
  // rows [head_row0, head_row0 + head_rows) of the parameter's h-th block
  // of rows / head_split rows, as [head_split, head_rows, in], or with
  // `transposed` as [head_split, in, head_rows] (attn_k_b: each head's
  // k_nope rows transposed).
  int64_t head_split = 0, head_row0 = 0, head_rows = 0;
  // Which of deepseek2's two GGUF layouts of kv_b the tensor belongs to:
  // llama.cpp's current attn_k_b + attn_v_b (Split: what its converter and
  // Nekton's export write; llama.cpp reads them when the file has
  // attention.key_length_mla) or the older unsplit attn_kv_b (Unsplit:
  // read by import when the file has no key_length_mla, never written).
  enum class KvB : uint8_t { Any, Split, Unsplit };
  KvB kv_b = KvB::Any;
};

// A reader over an HF config.json object whose errors name the file and key.
class HfConfigReader {
 public:
  HfConfigReader(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {}
  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  const nlohmann::json& at(const char* key) const { return j_.at(key); }
  int64_t integer(const char* key) const;  // missing: nk::Error
  int64_t integer(const char* key, int64_t def) const { return has(key) ? integer(key) : def; }
  // An integer in [1, limit] (core/limits.h); nk::Error naming the key, the
  // value and the limit otherwise. `what` names the unit ("layers").
  int64_t positive(const char* key, int64_t limit, const char* what) const;
  double number(const char* key, double def) const;  // a positive finite number, or def
  bool boolean(const char* key, bool def) const;
  std::string string(const char* key, const std::string& def) const;
  [[noreturn]] void unsupported(const char* key, const std::string& why) const;
  [[noreturn]] void fail_at(const std::string& what) const;  // "WHERE: what"
  const std::string& where() const { return where_; }
  const nlohmann::json& object() const { return j_; }  // the whole config.json

 private:
  const nlohmann::json& j_;
  std::string where_;
};

class Architecture {
 public:
  virtual ~Architecture() = default;
  virtual std::string name() const = 0;          // model.arch, e.g. "llama"
  virtual std::string display_name() const = 0;  // in messages, e.g. "Llama"
  virtual BlockSpec block() const = 0;
  // Whether its blocks' MLPs are Mixture-of-Experts (ModelConfig::num_experts).
  virtual bool moe() const { return false; }
  // Whether a model of it may have per-head q/k RMSNorms or not
  // (ModelConfig::qk_norm; GLM-4.5's use_qk_norm), beside block().qk_norm's
  // always.
  virtual bool optional_qk_norm() const { return false; }
  // Whether its Hugging Face (and GGUF) forms carry a partial rotary factor
  // (ModelConfig::partial_rotary_factor < 1): Phi-3's and GLM-4.5's do.
  virtual bool partial_rotary() const { return false; }
  virtual void add_presets(std::map<std::string, ModelConfig>& presets) const = 0;
  // Checks beyond the shared ones of ModelConfig::validate; nk::Error naming
  // prefix + key.
  virtual void validate(const ModelConfig& c, const std::string& prefix) const {}
  // The MLP size this family gives a model of width d_model that is derived
  // from `preset` (model.d_model overridden, model.d_ff not): by default the
  // Llama-style rule, the preset's d_ff / d_model ratio (which carries Meta's
  // 8/3 and ffn_dim_multiplier) rounded up to the preset's multiple (the
  // largest power of two up to 256 that divides its d_ff, Meta's multiple_of).
  // Sets `rule` to the rule in words, for --print-config.
  virtual int64_t derived_d_ff(const ModelConfig& preset, int64_t d_model, std::string& rule) const;

  // ---- parameters ----
  // Adds the parameters (names, shapes, initialisation, fused parts, tensor-
  // parallel split) to an unfinished layout. The shared decoder layout
  // follows block(); an architecture with other tensors overrides it.
  virtual void add_params(ParamLayout& p, const ModelConfig& c) const;

  // ---- Hugging Face ----
  // (class in `architectures`, model_type) pairs this architecture reads; the
  // first is what export writes.
  virtual std::vector<std::pair<std::string, std::string>> hf_classes() const = 0;
  // config.json -> c (c.arch is set by the caller). nk::Error naming the key.
  virtual void hf_read_config(const HfConfigReader& h, ModelConfig& c) const = 0;
  // c -> config.json keys (the shared ones are added by the caller).
  virtual void hf_write_config(const ModelConfig& c, nlohmann::ordered_json& j) const = 0;
  // The HF tensors of a model, in checkpoint order, under tensor prefix `prefix`.
  virtual std::vector<ExternalTensor> hf_tensors(const ModelConfig& c,
                                                 const std::string& prefix) const = 0;
  // The Hugging Face class of this architecture's sequence classifiers (a
  // score head in place of the LM head: ModelConfig::num_labels), or "" if
  // none. By default the first class's "ForCausalLM" made
  // "ForSequenceClassification" (LlamaForSequenceClassification, ...).
  virtual std::string hf_classifier_class() const;
  // The prefix HF checkpoints of this architecture may put before tensor names
  // ("transformer." for GPT-2); "" if none.
  virtual std::string hf_tensor_prefix() const { return ""; }
  // Storage dtype of an export with no recorded source dtype.
  virtual DType hf_default_dtype() const = 0;
  // Whether the HF tensor `name`, not among hf_tensors(c), is one import
  // leaves out rather than refuses (GLM-4.5's multi-token-prediction layers
  // after num_hidden_layers, which transformers does not load either).
  virtual bool hf_skipped_tensor(const ModelConfig& c, const std::string& name) const {
    return false;
  }

  // ---- GGUF (llama.cpp) ----
  // general.architecture, or "" when llama.cpp has no such architecture here.
  virtual std::string gguf_arch() const { return ""; }
  virtual std::vector<ExternalTensor> gguf_tensors(const ModelConfig& c) const { return {}; }
  // Whether llama.cpp's graph for gguf_arch() reads `rope_freqs.weight`
  // (per-pair frequency divisors: how llama3 RoPE scaling reaches llama.cpp).
  virtual bool gguf_rope_freqs() const { return false; }
  // How llama.cpp's graph for gguf_arch() runs a MoE block: whether it
  // renormalises the top-k softmax scores ("llama", "qwen3moe": yes;
  // "qwen2moe": no), and whether it sizes the experts by
  // <arch>.expert_feed_forward_length (and a shared expert by
  // expert_shared_feed_forward_length), feed_forward_length being the dense
  // MLP's, or by feed_forward_length ("llama").
  virtual bool gguf_norm_topk() const { return true; }
  virtual bool gguf_expert_ff_keys() const { return false; }
  // Whether that graph reads DeepSeek-V3's routing from the metadata
  // ("dots1"): expert_gating_func (1 softmax, 2 sigmoid), expert_weights_norm
  // (the top-k renormalised), expert_weights_scale (routed scaling),
  // expert_group_count / expert_group_used_count, the score bias as
  // blk.L.exp_probs_b.bias, leading_dense_block_count dense layers and an
  // ungated shared expert of expert_shared_count x the experts' width.
  virtual bool gguf_deepseek_routing() const { return false; }
};

// The registry. nk::Error listing the known names.
const Architecture& find_architecture(const std::string& name);
const std::vector<const Architecture*>& architectures();
std::vector<std::string> architecture_names();

// The HF tensors of a model of c (Architecture::hf_tensors): a sequence
// classifier's with its `score.weight` (no prefix, as HF's
// *ForSequenceClassification names it) in place of the LM head.
std::vector<ExternalTensor> hf_model_tensors(const ModelConfig& c, const std::string& prefix);

// The finished parameter layout of a model of c's architecture, with the
// parameters named in `frozen` frozen (see ParamLayout::freeze) and those in
// `quantized` (frozen too) stored quantised (ParamLayout::quantize).
ParamLayout model_layout(const ModelConfig& c, const std::vector<std::string>& frozen = {},
                         const std::vector<std::string>& quantized = {});

// The parameters every architecture of the GPT-2/Llama family shares, following
// `spec`: embedding (+ learned positions), per layer norm, fused QKV,
// output projection, norm, MLP up (fused [gate | up] for SwiGLU) and down,
// final norm, untied head. Parameter names follow Hugging Face's module paths
// loosely ("h.L.attn.qkv.weight"); ExternalTensor maps them to exact names.
void decoder_params(ParamLayout& p, const ModelConfig& c, const BlockSpec& spec);

// A MoE block's parameters (nn/moe.h), in place of the MLP's: the router
// h.L.moe.router.weight [E, C]; the experts' fused [gate | up] projections
// h.L.moe.up.weight [E 2F, C] (parts "e<i>.gate", "e<i>.up") and their down
// projections h.L.moe.down.weight [E C, F] (parts "e<i>"): one tensor per
// projection, so that each expert's rows are one contiguous block and the
// HF tensors (one per expert and projection) map to parts. With a shared
// expert (ModelConfig::moe_shared_d_ff) also h.L.moe.shared_up.weight
// [2Fs, C] (parts "gate", "up"), h.L.moe.shared_down.weight [C, Fs] and with
// its gate h.L.moe.shared_gate.weight [1, C]. With

// c.has_score_bias(), h.L.moe.score_bias [E] (zeros, frozen: the trainer's
// aux-loss-free balancing moves it, ModelConfig::moe_bias_update_rate).
void moe_params(ParamLayout& p, const ModelConfig& c, int64_t l);
// Layer l's Multi-head Latent Attention projections and norms
// (BlockSpec::latent_attention), in place of the fused QKV.
void latent_attention_params(ParamLayout& p, const ModelConfig& c, int64_t l);

// The config.json keys of Llama-style families (Llama, Mistral, Qwen2, ...),
// defined in arch/llama.cc for the families that reuse them: hidden_size,
// intermediate_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads (default: the heads), vocab_size,
// max_position_embeddings, rms_norm_eps (1e-6), tie_word_embeddings (false),
// initializer_range, head_dim (must be hidden_size / heads unless
// any_head_dim: then ModelConfig::attn_head_dim), hidden_act (silu),
// rope_theta and rope_scaling (model/rope.h), with their checks.
void hf_read_llama_style(const HfConfigReader& h, ModelConfig& c, bool any_head_dim = false);
// The same keys written back, in the order Llama's config.json has them.
void hf_write_llama_style(const ModelConfig& c, nlohmann::ordered_json& j);
// sliding_window as Mistral, Mixtral and Phi-3 have it (ModelConfig::
// sliding_window): null or absent is full attention, and so is a window
// covering max_position_embeddings; written back as null then.
void hf_read_sliding_window(const HfConfigReader& h, ModelConfig& c);
void hf_write_sliding_window(const ModelConfig& c, nlohmann::ordered_json& j);
// Llama-style HF tensor names (model.layers.L.self_attn.q_proj.weight, ...),
// with the q/k/v biases when qkv_bias, and self_attn.q_norm / k_norm when
// qk_norm (Qwen3).
std::vector<ExternalTensor> llama_style_hf_tensors(const ModelConfig& c, bool qkv_bias,
                                                   bool qk_norm = false);
// The config.json keys of the Qwen MoE families besides the Llama-style
// ones: num_experts, num_experts_per_tok, moe_intermediate_size,
// norm_topk_prob (default false, as both HF classes have it),
// router_aux_loss_coef (0.001), decoder_sparse_step and mlp_only_layers
// (the layers they make dense, an MLP of intermediate_size, go to
// ModelConfig::moe_dense_layers; export writes step 1 and lists them all),
// use_sliding_window (false only), and with a shared expert (Qwen2-MoE)
// shared_expert_intermediate_size (the shared expert is then gated).
void hf_read_qwen_moe(const HfConfigReader& h, ModelConfig& c, bool shared_expert);
void hf_write_qwen_moe(const ModelConfig& c, nlohmann::ordered_json& j, bool shared_expert);
// The HF tensors of a Qwen-MoE model (Qwen2MoeForCausalLM,
// Qwen3MoeForCausalLM): `dense`, the Llama-style ones, with each MoE
// layer's MLP replaced by its MoE block's after the post-attention norm: mlp.gate
// (the router), mlp.experts.e.{gate,up,down}_proj and, with a shared
// expert, mlp.shared_expert.{gate,up,down}_proj and mlp.shared_expert_gate.
std::vector<ExternalTensor> qwen_moe_hf_tensors(const ModelConfig& c,
                                                const std::vector<ExternalTensor>& dense);
// The HF tensors of a DeepSeek-V3-style MoE model (Dots1ForCausalLM,
// Glm4MoeForCausalLM; defined in arch/dots1.cc): `dense`, the Llama-style
// ones, with each MoE layer's MLP replaced after its post-attention norm by
// mlp.gate (the router), mlp.gate.e_score_correction_bias,
// mlp.experts.e.{gate,up,down}_proj and the ungated
// mlp.shared_experts.{gate,up,down}_proj.
std::vector<ExternalTensor> deepseek_moe_hf_tensors(const ModelConfig& c,
                                                    const std::vector<ExternalTensor>& dense);
// The same families' DeepSeek-V3 routing (defined in arch/dots1.cc):
// `family` names them in errors. validate: sigmoid scores, the score bias
// and an ungated shared expert, or nk::Error naming the key. The config.json
// keys n_routed_experts, num_experts_per_tok, moe_intermediate_size,
// n_shared_experts, norm_topk_prob, n_group, topk_group,
// routed_scaling_factor and first_k_dense_replace, with the class's
// defaults where a key may be absent (n_shared_experts and the groups
// required when their default is 0); written back after checking that the
// class can hold the model (`config_class` names it).
struct DeepseekMoeDefaults {
  int64_t shared_experts = 0;  // 0: n_shared_experts required
  int64_t groups = 0;          // 0: n_group and topk_group required
  bool norm_topk_prob = false;
  int64_t first_dense_layers = 0;
};
void validate_deepseek_moe(const ModelConfig& c, const std::string& p, const char* family);
void hf_read_deepseek_moe(const HfConfigReader& h, ModelConfig& c, const DeepseekMoeDefaults& d);
void hf_check_deepseek_moe(const ModelConfig& c, const char* config_class);
void hf_write_deepseek_moe(const ModelConfig& c, nlohmann::ordered_json& j);
// llama.cpp's names of the same tensors (blk.L.attn_q.weight, ...);
// rope_permute: q and k weight rows in llama.cpp's "llama" rotary order;
// qk_norm: blk.L.attn_q_norm / attn_k_norm (Qwen3).
std::vector<ExternalTensor> llama_style_gguf_tensors(const ModelConfig& c, bool qkv_bias,
                                                     bool rope_permute, bool qk_norm = false);
// `dense` (llama_style_gguf_tensors) with each MoE layer's MLP (ModelConfig::
// moe_layer) replaced by llama.cpp's MoE tensors after its ffn_norm: the
// router blk.L.ffn_gate_inp [E, C], the experts stacked as ffn_gate_exps
// and ffn_up_exps [E, F, C] and ffn_down_exps [E, C, F], with a score bias
// exp_probs_b.bias [E], and with a shared expert ffn_{gate,up,down}_shexp
// and its gate ffn_gate_inp_shexp [C].
std::vector<ExternalTensor> moe_gguf_tensors(const ModelConfig& c,
                                             const std::vector<ExternalTensor>& dense);
// Gemma's block (model/arch/gemma2.cc; Gemma 3 adds q/k norms): GeGLU,
// (1 + w) RMSNorms, post norms, scaled embeddings.
BlockSpec gemma_block(bool qk_norm);
// The config.json keys of Gemma 2 and Gemma 3's text model, defined in
// arch/gemma2.cc: the Llama-style sizes, head_dim (default 256),
// hidden_activation (gelu_pytorch_tanh only), query_pre_attn_scalar,
// attn_logit_softcapping and final_logit_softcapping (null: none),
// sliding_window, the local/global layers (layer_types, else Gemma 3's
// sliding_window_pattern or Gemma 2's alternation), rope_theta and
// rope_scaling, and Gemma 3's rope_local_base_freq. nk::Error naming the key.
void hf_read_gemma(const HfConfigReader& h, ModelConfig& c, bool gemma3);
void hf_write_gemma(const ModelConfig& c, nlohmann::ordered_json& j, bool gemma3);
// Gemma's HF tensor names: Llama's plus post_attention_layernorm on the
// attention's output, pre_feedforward_layernorm (Nekton's ln2),
// post_feedforward_layernorm, and with qk_norm self_attn.q_norm / k_norm.
std::vector<ExternalTensor> gemma_hf_tensors(const ModelConfig& c, bool qk_norm);
// Gemma's GGUF tensor names (llama.cpp's gemma2 / gemma3): Llama's with
// q and k rows as they are (NEOX rotation), blk.N.post_attention_norm,
// blk.N.post_ffw_norm, with qk_norm attn_q_norm / attn_k_norm, and every norm
// stored as 1 + w (ExternalTensor::add), the weight llama.cpp's plain RMSNorm
// multiplies by. The head is tied (llama.cpp's gemma2 reads no output.weight).
std::vector<ExternalTensor> gemma_gguf_tensors(const ModelConfig& c, bool qk_norm);

// The `<gguf_arch>.` metadata key llama.cpp reads the norms' epsilon from,
// which follows the norm: attention.layer_norm_rms_epsilon for RMSNorm,
// attention.layer_norm_epsilon for LayerNorm (gpt2).
std::string gguf_norm_eps_key(const BlockSpec& spec);

}  // namespace nk
