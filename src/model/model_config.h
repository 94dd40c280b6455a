// Model hyper-parameters and the registry of named architectures.
#pragma once
#include <algorithm>
#include <string>
#include <vector>

#include "core/config_bind.h"
#include "core/error.h"
#include "model/peft.h"
#include "model/rope.h"

namespace nk {

class Architecture;
struct BlockSpec;

// A model field that bind_model_keys recomputed from the overridden ones.
struct DerivedField {
  std::string key;   // "model.d_ff"
  std::string rule;  // how, in words
};

struct ModelConfig {
  std::string arch = "gpt2";  // a registered architecture (model/arch.h): gpt2, llama, ...
  int64_t vocab_size = 50257;
  int64_t max_seq_len = 1024;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_kv_head = 12;  // < n_head: grouped-query attention
  int64_t d_model = 768;
  int64_t d_ff = 3072;  // MLP inner size (per branch for SwiGLU)
  // Attention head size; 0: d_model / n_head. Qwen3 sets it apart (its
  // n_head x head_dim need not be d_model: q and the output projection are
  // then [n_head head_dim, d_model] and [d_model, n_head head_dim]).
  int64_t attn_head_dim = 0;
  // Multi-head Latent Attention (DeepSeek-V2/V3, nn/latent_attention.h;
  // kv_lora_rank > 0): keys and values from a latent of kv_lora_rank values
  // (and one rotary key of qk_rope_head_dim shared by the heads), queries
  // through a q_lora_rank bottleneck (0: one projection). head_dim is then
  // qk_nope_head_dim + qk_rope_head_dim, only the last qk_rope_head_dim
  // rotated, n_kv_head = n_head, and each head's value has v_head_dim.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  // Partial rotary (HF's partial_rotary_factor: GLM-4.5's 0.5, Phi-4-mini's
  // 0.75): RoPE turns the first int(head_dim x factor) values of each q and
  // k head (rotate-half over those, frequencies those of a head of that
  // size), the rest pass through. 1: the whole head. Not with MLA (its
  // qk_rope_head_dim says which values turn).
  double partial_rotary_factor = 1.0;
  // Per-head RMSNorms on q and k before the rotation where an architecture
  // makes them optional (Architecture::optional_qk_norm: GLM-4.5's
  // use_qk_norm); those that always have them (Qwen3) say so in their
  // BlockSpec. ModelConfig::block() merges the two.
  bool qk_norm = false;
  // Sliding-window attention (Mistral): each token attends to the last
  // `sliding_window` positions, itself included; 0 = full causal attention.
  int64_t sliding_window = 0;
  // Local and global layers (Gemma 2 and 3): with a window and a pattern P
  // > 0, layer l is global (full causal attention) when (l + 1) % P == 0 and
  // windowed otherwise: Gemma 2's P = 2 (even layers local), Gemma 3's 6
  // (five local, then one global). 0: every layer windowed (Mistral).
  int64_t sliding_window_pattern = 0;
  RopeScaling rope_scaling;  // none: plain rotary positions (model/rope.h)
  // The windowed layers' own RoPE base, without rope_scaling (Gemma 3's
  // rope_local_base_freq; its rope_scaling is the global layers'); 0: the
  // windowed layers rotate as the others do.
  double rope_local_theta = 0.0;
  // Attention scores scaled by 1/sqrt(query_pre_attn_scalar) (Gemma); 0:
  // 1/sqrt(head_dim).
  double query_pre_attn_scalar = 0.0;
  // Soft-capping (Gemma 2): attention scores s -> c tanh(s / c) before the
  // softmax (attn_logit_softcapping) and the LM head's logits likewise
  // (final_logit_softcapping); 0: none.
  double attn_logit_softcap = 0.0;
  double final_logit_softcap = 0.0;
  // Mixture of Experts (nn/moe.h; an architecture whose moe() is true,
  // Mixtral): every block's MLP is num_experts SwiGLU experts of moe_d_ff
  // units each (0: d_ff), each token routed to the num_experts_per_tok of
  // highest router score. 0 experts: the dense MLP.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 2;  // top-k
  int64_t moe_d_ff = 0;
  // A shared expert (nn/moe.h) every token goes through besides its routed
  // ones: one SwiGLU MLP of moe_shared_d_ff units (0: none; DeepSeek's
  // n_shared_experts x moe_intermediate_size, Qwen2-MoE's
  // shared_expert_intermediate_size), its output scaled by sigmoid(x . w)
  // (w [1, C]) when moe_shared_expert_gate (Qwen2-MoE).
  int64_t moe_shared_d_ff = 0;
  bool moe_shared_expert_gate = false;
  bool norm_topk_prob = true;              // renormalise the top-k scores to sum to 1
  std::string moe_score_func = "softmax";  // router scores: softmax or sigmoid
  // > 0: each expert computes at most ceil(factor N k / E) of a forward's N
  // tokens' pairs, the rest dropped (nn/moe.h); 0: dropless. Not applied by
  // the cached decode.
  double moe_capacity_factor = 0.0;
  // Training loss terms, over all MoE layers' tokens together (as HF's
  // load_balancing_loss_func): coeff x E sum_e f_e P_e (f_e: fraction of the
  // routed pairs that chose e, P_e: mean score of e) and z-coeff x the mean
  // of logsumexp(router logits)^2 (ST-MoE's router z-loss).
  double moe_aux_loss_coeff = 0.0;
  double moe_z_loss_coeff = 0.0;
  // The balancing loss's form: "global" (above) or "seq", DeepSeek-V3's
  // sequence-wise loss: per layer and sequence, coeff x E / k sum_e f_e P_e
  // (f_e: pairs of the sequence routed to e over its tokens, P_e: mean
  // balancing score of e over its tokens), averaged over layers and
  // sequences.
  std::string moe_aux_loss_type = "global";
  // DeepSeek-V3's routing (ops::MoeRouteSpec): the experts in moe_n_group
  // groups, each token's top-k taken from its moe_topk_group best groups
  // (a group's score: the sum of its two best choice scores); the weights
  // times moe_routed_scaling (routed_scaling_factor).
  int64_t moe_n_group = 1;
  int64_t moe_topk_group = 1;
  double moe_routed_scaling = 1.0;
  // An expert score-correction bias per MoE layer (h.L.moe.score_bias [E],
  // HF's e_score_correction_bias), added to the scores for choosing only.
  // Aux-loss-free balancing (DeepSeek-V3 2.1.2) moves it after every
  // optimizer step by rate x sign(mean load - load_e), the loads counted over
  // the step's tokens (all data-parallel ranks'); 0: not moved. A rate > 0
  // implies the bias. It is model state (checkpoints, exports), never the
  // optimizer's.
  bool moe_score_bias = false;
  double moe_bias_update_rate = 0.0;
  // DeepSeek's first_k_dense_replace: layers [0, k) have a dense SwiGLU MLP
  // of d_ff units, the rest are MoE.
  int64_t moe_first_dense_layers = 0;
  // More layers with a dense MLP of d_ff units, anywhere (ascending, no
  // repeats; Qwen-MoE's mlp_only_layers and decoder_sparse_step).
  std::vector<int64_t> moe_dense_layers;
  bool tied_embeddings = true;
  double init_std = 0.02;
  // A sequence classifier (Hugging Face's *ForSequenceClassification): 0 is
  // a causal LM with its LM head; >= 1 replaces the head with `score`
  // [num_labels, d_model], read at each sequence's last token: a reward
  // model (1 label) or an attribute model (SteerLM: one per attribute).
  // `labels` names them (HF's id2label), empty or num_labels of them.
  int64_t num_labels = 0;
  std::vector<std::string> labels;
  // A value head beside the LM head (PPO's critic on the policy's trunk, as
  // TRL's AutoModelForCausalLMWithValueHead): `value_head.weight` [1,
  // d_model] and `value_head.bias` [1] over the final norm's output, one
  // value per position. Not a model.* key: align.method=ppo adds it; HF and
  // GGUF exports leave it out (the policy alone).
  bool value_head = false;
  // Megatron's --make-vocab-size-divisible-by: under tensor parallelism the
  // embedding and head are padded with zero rows to a multiple of this x tp
  // (padded_vocab_size), which the cross-entropy never scores. Not saved
  // with a model: a layout choice (checkpoints and exports hold vocab_size
  // rows), so a run at one tp resumes at any other.
  int64_t make_vocab_size_divisible_by = 128;
  // Parameter-efficient adapters (model/peft.h), one method at most: on the
  // blocks' linear layers LoRA's (rank 0: none), IA3's (no targets: none) or
  // bottleneck adapters (dim 0: none); or p-tuning's virtual tokens (0:
  // none). Not model.* keys: peft.* sets them for a run, a saved model
  // records them.
  LoraConfig lora;
  Ia3Config ia3;
  BottleneckConfig bottleneck;
  PromptConfig prompt;
  // The fields bind_model_keys derived from overridden ones (for nekton
  // train --print-config); not saved with the model.
  std::vector<DerivedField> derived;
  bool classifier() const { return num_labels > 0; }
  // Whether the LM head is the token embedding (a classifier has no LM head).
  bool head_tied() const { return tied_embeddings && !classifier(); }
  // Whether a parameter is the head stage's (the final norm, LM, score or
  // value head): a pipeline's last stage holds it, its gradient is the
  // head's backward unit.
  static bool head_param(const std::string& name) {
    return name.starts_with("ln_f.") || name.starts_with("lm_head.") ||
           name.starts_with("score.") || name.starts_with("value_head.");
  }
  bool has_adapters() const {
    return lora.enabled() || ia3.enabled() || bottleneck.enabled() || prompt.enabled();
  }

  // The registered architecture named by `arch` (nk::Error if unknown).
  const Architecture& architecture() const;
  int64_t head_dim() const { return attn_head_dim > 0 ? attn_head_dim : d_model / n_head; }
  bool mla() const { return kv_lora_rank > 0; }
  // The values of a head RoPE turns: MLA's qk_rope_head_dim, else
  // int(head_dim x partial_rotary_factor) (all of them at 1), as HF's
  // rotary embeddings size their table; the 1e-6 keeps a factor written as
  // r / head_dim (GGUF import) from truncating to r - 1.
  int64_t rotary_dim() const {
    return mla() ? qk_rope_head_dim : int64_t(double(head_dim()) * partial_rotary_factor + 1e-6);
  }
  // The architecture's block choices with this model's optional ones
  // (qk_norm) merged in: what the layers, layouts and exports follow.
  BlockSpec block() const;
  // The attention output's width per head (the output projection's input / n_head).
  int64_t out_head_dim() const { return mla() ? v_head_dim : head_dim(); }
  // Whether layer l is a local (windowed) one, per sliding_window_pattern;
  // its window (0: full causal attention).
  bool layer_local(int64_t l) const {
    return sliding_window > 0 &&
           !(sliding_window_pattern > 0 && (l + 1) % sliding_window_pattern == 0);
  }
  int64_t layer_window(int64_t l) const { return layer_local(l) ? sliding_window : 0; }
  // The attention scores' factor: 0 for 1/sqrt(head_dim) (ops::attention_forward).
  float attn_scale() const;
  bool is_moe() const { return num_experts > 0; }
  // Whether layer l's MLP is Mixture-of-Experts (else dense).
  bool moe_layer(int64_t l) const {
    return is_moe() && l >= moe_first_dense_layers &&
           !std::binary_search(moe_dense_layers.begin(), moe_dense_layers.end(), l);
  }
  // The MoE layers' count; whether some layers are dense.
  int64_t n_moe_layers() const;
  bool has_dense_layers() const { return !is_moe() || n_moe_layers() < n_layer; }
  bool has_score_bias() const { return is_moe() && (moe_score_bias || moe_bias_update_rate > 0); }
  int64_t expert_d_ff() const { return moe_d_ff > 0 ? moe_d_ff : d_ff; }
  int64_t qkv_dim() const { return (n_head + 2 * n_kv_head) * head_dim(); }
  // Rows of the MLP's up projection: d_ff, or 2 d_ff for SwiGLU's [gate | up].
  int64_t mlp_up_dim() const;
  // The embedding's and head's rows under tp-way tensor parallelism:
  // vocab_size rounded up to a multiple of make_vocab_size_divisible_by x tp,
  // each rank holding padded / tp of them; vocab_size itself at tp = 1 (one
  // process never pads, so its runs and files are what they always were).
  int64_t padded_vocab_size(int64_t tp) const;
  // Throws nk::Error naming the config key of an impossible value.
  void validate(const std::string& prefix = "model.") const;
  void validate_moe(const std::string& prefix, const Architecture& a) const;
  void validate_mla(const std::string& prefix, const Architecture& a) const;
  // Megatron's FLOP count for one training step over `tokens` tokens of
  // sequence length T (forward + backward = 3x forward, no recompute),
  // generalised to grouped-query attention and SwiGLU; equals
  // 72 B T L h^2 (1 + T/6h + V/12hL) for GPT-2.
  double train_flops(int64_t tokens, int64_t T) const;
};

// Named presets, each defined by its architecture's file: gpt2-124m,
// gpt2-355m, gpt2-774m, gpt2-1.5b, the quickstart's gpt-tiny, llama-tiny,
// llama-1b (Llama 3.2 1B's shape), llama2-7b, qwen2-tiny, qwen2-0.5b, ...
ModelConfig model_preset(const std::string& name);  // nk::Error listing presets
std::vector<std::string> model_preset_names();

// Config keys "model.*": `model.preset` picks a preset, every other key
// overrides it when set to a non-default value. Sizes that follow from an
// overridden one are derived unless set too, keeping the preset's
// proportions: model.d_model gives n_head (the preset's head size), and
// through it n_kv_head (the preset's query heads per key/value head), and
// d_ff (the family's rule, Architecture::derived_d_ff); model.n_head gives
// n_kv_head. A reading binder leaves `m` the resolved, validated model, its
// `derived` listing what was derived.
void bind_model_keys(ConfigBinder& b, ModelConfig& m);
ConfigSchema model_schema();  // the model.* keys alone
ModelConfig model_config_from(const Config& cfg);

}  // namespace nk
