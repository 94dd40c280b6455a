#include "model/model_config.h"

#include "model/arch.h"

#include "core/limits.h"

#include <fmt/ranges.h>

#include <cmath>
#include <map>

namespace nk {

const Architecture& ModelConfig::architecture() const {
  return find_architecture(arch);
}

BlockSpec ModelConfig::block() const {
  BlockSpec s = architecture().block();
  s.qk_norm = s.qk_norm || qk_norm;
  return s;
}

int64_t ModelConfig::mlp_up_dim() const {
  return architecture().block().swiglu ? 2 * d_ff : d_ff;
}

float ModelConfig::attn_scale() const {
  if (mla() && rope_scaling.enabled() && rope_scaling.mscale_all_dim > 0 &&
      rope_scaling.factor > 1) {
    // DeepSeek: 1/sqrt(head_dim) times yarn's mscale(factor, mscale_all_dim)
    // squared, the latter 0.1 m ln(factor) + 1.
    const double m = 0.1 * rope_scaling.mscale_all_dim * std::log(rope_scaling.factor) + 1.0;
    return float(m * m / std::sqrt(double(head_dim())));
  }
  return query_pre_attn_scalar > 0 ? float(1.0 / std::sqrt(query_pre_attn_scalar)) : 0.f;
}

void ModelConfig::validate_mla(const std::string& p, const Architecture& a) const {
  const bool latent = a.block().latent_attention;
  if (!latent) {
    if (kv_lora_rank != 0 || q_lora_rank != 0 || qk_rope_head_dim != 0 || v_head_dim != 0)
      fail(
          "{}kv_lora_rank: {} has no Multi-head Latent Attention (model.arch=deepseek_v2 or "
          "deepseek_v3 has; got kv_lora_rank {}, q_lora_rank {}, qk_rope_head_dim {}, "
          "v_head_dim {})",
          p, a.display_name(), kv_lora_rank, q_lora_rank, qk_rope_head_dim, v_head_dim);
    return;
  }
  if (kv_lora_rank <= 0)
    fail("{}kv_lora_rank: {} needs a latent of positive size, got {}", p, a.display_name(),
         kv_lora_rank);
  check_limit("", p + "kv_lora_rank", kv_lora_rank, limits::kHidden, "units");
  if (q_lora_rank < 0)
    fail("{}q_lora_rank: must be 0 (one query projection) or positive, got {}", p, q_lora_rank);
  check_limit("", p + "q_lora_rank", q_lora_rank, limits::kHidden, "units");
  if (qk_rope_head_dim <= 0 || qk_rope_head_dim % 2 || qk_rope_head_dim >= head_dim())
    fail(
        "{}qk_rope_head_dim: must be even, positive and below {}head_dim = {} (the nope part "
        "is the rest), got {}",
        p, p, head_dim(), qk_rope_head_dim);
  if (v_head_dim <= 0 || v_head_dim > head_dim())
    fail("{}v_head_dim: must be in [1, {}head_dim = {}] (qk_nope + qk_rope), got {}", p, p,
         head_dim(), v_head_dim);
  if (n_kv_head != n_head)
    fail(
        "{}n_kv_head: Multi-head Latent Attention has a key and a value per head ({}n_head = "
        "{}), got {}",
        p, p, n_head, n_kv_head);
  if (sliding_window > 0)
    fail("{}sliding_window: not supported with Multi-head Latent Attention", p);
  if (lora.enabled() || ia3.enabled() || bottleneck.enabled())
    fail(
        "peft.method: adapters on {}'s Multi-head Latent Attention layers are not supported yet "
        "(p-tuning and full fine-tuning are)",
        a.display_name());
}

int64_t ModelConfig::padded_vocab_size(int64_t tp) const {
  return padded_rows(vocab_size, make_vocab_size_divisible_by, tp);
}

void ModelConfig::validate(const std::string& p) const {
  const Architecture* a = nullptr;
  try {
    a = &architecture();
  } catch (const Error& e) {
    fail("{}arch: {}", p, e.what());
  }
  // Bounded before anything is sized from them (core/limits.h).
  auto shape = [&](const char* key, int64_t v, int64_t limit, const char* what) {
    if (v <= 0) fail("{}{}: must be positive, got {}", p, key, v);
    check_limit("", p + key, v, limit, what);
  };
  shape("vocab_size", vocab_size, limits::kVocab, "token ids");
  shape("max_seq_len", max_seq_len, limits::kSeqLen, "positions");
  shape("n_layer", n_layer, limits::kLayers, "layers");
  shape("n_head", n_head, limits::kHeads, "heads");
  shape("n_kv_head", n_kv_head, limits::kHeads, "heads");
  shape("d_model", d_model, limits::kHidden, "hidden units");
  shape("d_ff", d_ff, limits::kFfn, "MLP units");
  shape("make_vocab_size_divisible_by", make_vocab_size_divisible_by, limits::kVocab, "token ids");
  if (attn_head_dim < 0)
    fail("{}head_dim: must be 0 (d_model / n_head) or positive, got {}", p, attn_head_dim);
  check_limit("", p + "head_dim", attn_head_dim, limits::kHidden, "units");
  if (attn_head_dim == 0 && d_model % n_head)
    fail("{}n_head: {} heads do not divide {}d_model = {} (or set {}head_dim)", p, n_head, p,
         d_model, p);
  if (n_head % n_kv_head)
    fail("{}n_kv_head: {} kv heads do not divide {}n_head = {}", p, n_kv_head, p, n_head);
  if (!a->block().learned_positions && head_dim() % 2)
    fail("{}n_head: RoPE needs an even head size, got {}", p, head_dim());
  if (partial_rotary_factor != 1.0) {
    if (!(partial_rotary_factor > 0 && partial_rotary_factor <= 1))
      fail("{}partial_rotary_factor: must be in (0, 1] (the share of each head RoPE turns), got {}",
           p, partial_rotary_factor);
    if (a->block().learned_positions)
      fail("{}partial_rotary_factor: {} has learned positions, not rotary ones", p, arch);
    if (!a->partial_rotary())
      fail(
          "{}partial_rotary_factor: {} turns whole heads (its Hugging Face and GGUF forms have no "
          "partial rotary; phi3 and glm4_moe do), got {}",
          p, a->display_name(), partial_rotary_factor);
    if (a->block().latent_attention)
      fail(
          "{}partial_rotary_factor: {}'s Multi-head Latent Attention turns qk_rope_head_dim "
          "values (set that instead)",
          p, a->display_name());
    const int64_t r = rotary_dim();
    if (r < 2 || r % 2)
      fail(
          "{}partial_rotary_factor: {} x head_dim {} gives {} rotated values per head; RoPE "
          "needs an even number, at least 2",
          p, partial_rotary_factor, head_dim(), r);
  }
  if (qk_norm && !a->block().qk_norm && !a->optional_qk_norm())
    fail(
        "{}qk_norm: {} has no q/k norms (qwen3, gemma3 and glm4_moe have them; got qk_norm = "
        "true)",
        p, a->display_name());
  if (sliding_window < 0)
    fail("{}sliding_window: must be 0 (full attention) or positive, got {}", p, sliding_window);
  check_limit("", p + "sliding_window", sliding_window, limits::kSeqLen, "positions");
  if (sliding_window_pattern < 0)
    fail("{}sliding_window_pattern: must be 0 (every layer windowed) or positive, got {}", p,
         sliding_window_pattern);
  if (sliding_window_pattern > 0 && sliding_window == 0)
    fail("{}sliding_window_pattern: {} needs local layers ({}sliding_window > 0)", p,
         sliding_window_pattern, p);
  for (auto [key, v] : {std::pair<const char*, double>{"rope_local_theta", rope_local_theta},
                        {"query_pre_attn_scalar", query_pre_attn_scalar},
                        {"attn_logit_softcap", attn_logit_softcap},
                        {"final_logit_softcap", final_logit_softcap}})
    if (!(v >= 0) || !std::isfinite(v))
      fail("{}{}: must be a finite number >= 0 (0: off), got {}", p, key, v);
  if (rope_local_theta > 0 && (sliding_window == 0 || a->block().learned_positions))
    fail(
        "{}rope_local_theta: the local layers' RoPE base needs rotary local layers "
        "({}sliding_window > 0)",
        p, p);
  if (!(norm_eps > 0)) fail("{}norm_eps: must be positive, got {}", p, norm_eps);
  if (!(rope_theta > 0)) fail("{}rope_theta: must be positive, got {}", p, rope_theta);
  if (!(init_std > 0)) fail("{}init_std: must be positive, got {}", p, init_std);
  if (num_labels < 0)
    fail("{}num_labels: must be 0 (a causal LM) or positive, got {}", p, num_labels);
  check_limit("", p + "num_labels", num_labels, limits::kLabels, "labels");
  if (!labels.empty() && int64_t(labels.size()) != num_labels)
    fail("{}labels: {} names for num_labels = {}", p, labels.size(), num_labels);
  if (value_head && classifier())
    fail("{}num_labels: a sequence classifier has no LM head for a value head to go beside", p);
  if (classifier() && a->hf_classifier_class().empty())
    fail(
        "{}num_labels: {} has no sequence classifier (reward model) in Hugging Face's "
        "transformers to import or export one as; use another architecture",
        p, arch);
  if (a->block().learned_positions && rope_scaling.enabled())
    fail("{}rope_scaling.type: {} has learned positions, not rotary ones to scale", p, arch);
  rope_scaling.validate(p + "rope_scaling.");
  validate_mla(p, *a);
  validate_moe(p, *a);
  a->validate(*this, p);
  validate_adapters(*this, "peft.");
}

void ModelConfig::validate_moe(const std::string& p, const Architecture& a) const {
  if (num_experts < 0) fail("{}num_experts: must be 0 (dense) or positive, got {}", p, num_experts);
  if (num_experts == 0 && a.moe())
    fail("{}num_experts: {} is a Mixture-of-Experts architecture, it needs experts (got 0)", p,
         a.display_name());
  if (num_experts == 0) return;
  if (!a.moe())
    fail("{}num_experts: {} has no Mixture-of-Experts blocks (got {}; model.arch=mixtral has)", p,
         a.display_name(), num_experts);
  check_limit("", p + "num_experts", num_experts, limits::kMaxExperts, "experts");
  if (num_experts_per_tok < 1 || num_experts_per_tok > num_experts)
    fail("{}num_experts_per_tok: must be in [1, {}num_experts = {}], got {}", p, p, num_experts,
         num_experts_per_tok);
  if (moe_d_ff < 0) fail("{}moe_d_ff: must be 0 (model.d_ff) or positive, got {}", p, moe_d_ff);
  check_limit("", p + "moe_d_ff", moe_d_ff, limits::kFfn, "MLP units");
  if (moe_shared_d_ff < 0)
    fail("{}moe_shared_d_ff: must be 0 (no shared expert) or positive, got {}", p, moe_shared_d_ff);
  check_limit("", p + "moe_shared_d_ff", moe_shared_d_ff, limits::kFfn, "MLP units");
  if (moe_shared_expert_gate && moe_shared_d_ff == 0)
    fail("{}moe_shared_expert_gate: a gate needs a shared expert ({}moe_shared_d_ff > 0)", p, p);
  if (moe_score_func != "softmax" && moe_score_func != "sigmoid")
    fail("{}moe_score_func: expected softmax or sigmoid, got '{}'", p, moe_score_func);
  for (auto [key, v] : {std::pair<const char*, double>{"moe_aux_loss_coeff", moe_aux_loss_coeff},
                        {"moe_z_loss_coeff", moe_z_loss_coeff},
                        {"moe_capacity_factor", moe_capacity_factor},
                        {"moe_bias_update_rate", moe_bias_update_rate}})
    if (!(v >= 0) || !std::isfinite(v))
      fail("{}{}: must be a finite number >= 0, got {}", p, key, v);
  if (moe_aux_loss_type != "global" && moe_aux_loss_type != "seq")
    fail("{}moe_aux_loss_type: expected global or seq, got '{}'", p, moe_aux_loss_type);
  if (moe_n_group < 1 || num_experts % moe_n_group != 0)
    fail("{}moe_n_group: must divide {}num_experts = {}, got {}", p, p, num_experts, moe_n_group);
  if (moe_topk_group < 1 || moe_topk_group > moe_n_group)
    fail("{}moe_topk_group: must be in [1, {}moe_n_group = {}], got {}", p, p, moe_n_group,
         moe_topk_group);
  if (num_experts_per_tok > moe_topk_group * (num_experts / moe_n_group))
    fail("{}num_experts_per_tok: {} exceeds the {} experts of {}moe_topk_group = {} groups", p,
         num_experts_per_tok, moe_topk_group * (num_experts / moe_n_group), p, moe_topk_group);
  if (!(moe_routed_scaling > 0) || !std::isfinite(moe_routed_scaling))
    fail("{}moe_routed_scaling: must be a finite number > 0, got {}", p, moe_routed_scaling);
  if (moe_first_dense_layers < 0 || moe_first_dense_layers >= n_layer)
    fail("{}moe_first_dense_layers: must be in [0, {}n_layer = {}), got {}", p, p, n_layer,
         moe_first_dense_layers);
  for (size_t i = 0; i < moe_dense_layers.size(); ++i) {
    const int64_t l = moe_dense_layers[i];
    if (l < 0 || l >= n_layer)
      fail("{}moe_dense_layers: layer {} is not in [0, {}n_layer = {})", p, l, p, n_layer);
    if (i > 0 && l <= moe_dense_layers[i - 1])
      fail("{}moe_dense_layers: layers must be ascending without repeats, got {} after {}", p, l,
           moe_dense_layers[i - 1]);
  }
  if (n_moe_layers() == 0)
    fail("{}moe_dense_layers: every layer is dense ({}num_experts = {} needs a MoE layer)", p, p,
         num_experts);
  if (has_adapters() && !lora.enabled())
    fail(
        "peft.method: {} on a Mixture-of-Experts model ({}num_experts = {}) are not supported "
        "yet (LoRA is: peft.method=lora)",
        ia3.enabled()          ? "IA3 adapters"
        : bottleneck.enabled() ? "bottleneck adapters"
                               : "p-tuning",
        p, num_experts);
}

int64_t ModelConfig::n_moe_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < n_layer; ++l) n += moe_layer(l) ? 1 : 0;
  return n;
}

double ModelConfig::train_flops(int64_t tokens, int64_t T) const {
  double C = double(d_model), L = double(n_layer);
  // A MoE block costs its k active experts and its shared expert (the
  // router's E C is negligible); the dense layers (moe_first_dense_layers,
  // moe_dense_layers) a dense MLP (per layer: the mean).
  const double dense = (architecture().block().swiglu ? 3.0 : 2.0) * C * double(d_ff);
  double mlp = dense;
  if (is_moe()) {
    const double moe = 3.0 * C * double(expert_d_ff()) * double(num_experts_per_tok) +
                       3.0 * C * double(moe_shared_d_ff);
    const double fd = double(n_layer - n_moe_layers());
    mlp = (fd * dense + (L - fd) * moe) / L;
  }
  double attn = C * double(qkv_dim()) + double(n_head * head_dim()) * C;
  if (mla()) {  // the low-rank projections, then each head's out of v_head_dim
    const double H = double(n_head), D = double(head_dim()), rq = double(q_lora_rank),
                 rkv = double(kv_lora_rank), nope = D - double(qk_rope_head_dim);
    attn = (rq > 0 ? C * rq + rq * H * D : C * H * D) + C * (rkv + double(qk_rope_head_dim)) +
           rkv * H * (nope + double(v_head_dim)) + H * double(v_head_dim) * C;
  }
  double per_layer = 2.0 * (attn + mlp) + 4.0 * double(T) * double(n_head * head_dim());
  double forward = L * per_layer + 2.0 * C * double(vocab_size);
  return 3.0 * forward * double(tokens);
}

static const std::map<std::string, ModelConfig>& presets() {
  static const std::map<std::string, ModelConfig> m = [] {
    std::map<std::string, ModelConfig> r;
    for (const Architecture* a : architectures()) a->add_presets(r);
    return r;
  }();
  return m;
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> v;
  for (auto& [k, _] : presets()) v.push_back(k);
  return v;
}

ModelConfig model_preset(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end())
    fail("model.preset: unknown preset '{}' (available: {})", name,
         fmt::join(model_preset_names(), ", "));
  return it->second;
}

namespace {

// The sizes that follow from overridden ones (bind_model_keys' comment), each
// recorded in m.derived. nk::Error naming the key when the preset's
// proportions do not fit the value given.
void derive_sizes(ModelConfig& m, const ModelConfig& preset, bool width, bool heads, bool kv_heads,
                  bool ffn) {
  m.derived.clear();
  if (width && !heads) {
    // The preset's width per head: its head size, or with a head size of
    // its own (model.head_dim, kept) d_model / n_head all the same.
    const int64_t hd = preset.d_model / preset.n_head;
    const char* what = preset.attn_head_dim > 0 ? "width per head" : "head size";
    if (m.d_model % hd != 0)
      fail(
          "model.d_model: {} is not a multiple of the preset's {} {} ({} / {} heads); "
          "set model.n_head too",
          m.d_model, what, hd, preset.d_model, preset.n_head);
    m.n_head = m.d_model / hd;
    m.derived.push_back({"model.n_head", fmt::format("d_model / {}, the preset's {}", hd, what)});
  }
  if ((width || heads) && !kv_heads && m.n_head != preset.n_head) {
    const int64_t group = preset.n_head / preset.n_kv_head;
    if (m.n_head % group != 0)
      fail(
          "model.n_head: {} heads do not split into the preset's groups of {} query heads per "
          "key/value head; set model.n_kv_head too",
          m.n_head, group);
    m.n_kv_head = m.n_head / group;
    m.derived.push_back(
        {"model.n_kv_head",
         group == 1
             ? std::string("n_head, as the preset's (multi-head attention)")
             : fmt::format("n_head / {}, the preset's query heads per key/value head", group)});
  }
  if (width && !ffn) {
    std::string rule;
    m.d_ff = m.architecture().derived_d_ff(preset, m.d_model, rule);
    m.derived.push_back({"model.d_ff", rule});
  }
}

}  // namespace

void bind_model_keys(ConfigBinder& b, ModelConfig& m) {
  // Every key but the preset overrides the preset when set to a non-default value.
  ModelConfig preset;  // the preset's own sizes, for the derived ones
  b.bind_with<std::string>("model.preset", "gpt-tiny",
                           fmt::format("named model: {}", fmt::join(model_preset_names(), ", ")),
                           [&](const std::string& name) { preset = m = model_preset(name); });
  b.bind_unless("model.arch", m.arch, "",
                fmt::format("override: architecture ({})", fmt::join(architecture_names(), ", ")));
  b.bind_unless("model.vocab_size", m.vocab_size, 0,
                "override: vocabulary size (0 = preset's or tokenizer's)");
  b.bind_unless("model.max_seq_len", m.max_seq_len, 0,
                "override: longest sequence (positions) the model supports");
  b.bind_unless("model.n_layer", m.n_layer, 0, "override: transformer layers");
  const bool heads = b.bind_unless("model.n_head", m.n_head, 0,
                                   "override: attention heads (0 = d_model / the preset's head "
                                   "size when d_model is set)");
  bool kv_heads = b.bind_unless("model.n_kv_head", m.n_kv_head, 0,
                                "override: key/value heads (grouped-query attention; 0 = "
                                "the preset's query heads per key/value head when n_head "
                                "changes)");
  const bool width = b.bind_unless("model.d_model", m.d_model, 0, "override: hidden size");
  const bool ffn = b.bind_unless("model.d_ff", m.d_ff, 0,
                                 "override: MLP inner size (0 = the family's rule from "
                                 "d_model when d_model is set)");
  b.bind_unless("model.head_dim", m.attn_head_dim, -1,
                "override: attention head size (0 = d_model / n_head; -1 = preset's)");
  b.bind_unless("model.q_lora_rank", m.q_lora_rank, int64_t(-1),
                "override: MLA's query bottleneck (DeepSeek; 0 = one projection; -1 = preset's)");
  b.bind_unless("model.kv_lora_rank", m.kv_lora_rank, int64_t(-1),
                "override: MLA's key/value latent size (DeepSeek; -1 = preset's)");
  b.bind_unless("model.qk_rope_head_dim", m.qk_rope_head_dim, int64_t(-1),
                "override: MLA's rotated values per head, the last of head_dim (-1 = preset's)");
  b.bind_unless("model.v_head_dim", m.v_head_dim, int64_t(-1),
                "override: MLA's value size per head (-1 = preset's)");
  b.bind_unless("model.norm_eps", m.norm_eps, 0.0, "override: epsilon of LayerNorm/RMSNorm");
  b.bind_unless("model.rope_theta", m.rope_theta, 0.0, "override: RoPE base frequency");
  b.bind_unless("model.partial_rotary_factor", m.partial_rotary_factor, 0.0,
                "override: share of each q/k head RoPE turns, the first values (GLM-4.5: 0.5; "
                "1 = all; 0 = preset's)");
  b.bind_with<std::string>("model.qk_norm", "",
                           "override: true/false, per-head RMSNorms on q and k before RoPE where "
                           "the architecture makes them optional (GLM-4.5's use_qk_norm)",
                           [&](const std::string& t) {
                             if (t.empty()) return;
                             if (t != "true" && t != "false")
                               fail("model.qk_norm: expected true or false, got '{}'", t);
                             m.qk_norm = t == "true";
                           });
  b.bind("model.make_vocab_size_divisible_by", m.make_vocab_size_divisible_by,
         "under parallel.tp > 1, pad the embedding and head with zero rows (never scored) to a "
         "multiple of this x tp, as Megatron does; checkpoints and exports keep vocab_size rows");
  b.bind_unless("model.sliding_window", m.sliding_window, -1,
                "override: sliding-window attention over this many positions (0 = full; -1 = "
                "preset's)");
  b.bind_unless("model.sliding_window_pattern", m.sliding_window_pattern, -1,
                "override: with a sliding window, every this-th layer is global (full attention; "
                "Gemma 2: 2, Gemma 3: 6); 0 = every layer windowed; -1 = preset's");
  b.bind_unless("model.rope_local_theta", m.rope_local_theta, -1.0,
                "override: the windowed layers' RoPE base, without rope_scaling (Gemma 3's "
                "rope_local_base_freq; 0 = as the other layers; -1 = preset's)");
  b.bind_unless("model.query_pre_attn_scalar", m.query_pre_attn_scalar, -1.0,
                "override: attention scores scaled by 1/sqrt(this) (Gemma; 0 = head_dim; -1 = "
                "preset's)");
  b.bind_unless("model.attn_logit_softcap", m.attn_logit_softcap, -1.0,
                "override: attention scores soft-capped to c tanh(s / c) (Gemma 2; 0 = none; -1 "
                "= preset's)");
  b.bind_unless("model.final_logit_softcap", m.final_logit_softcap, -1.0,
                "override: logits soft-capped to c tanh(z / c) (Gemma 2; 0 = none; -1 = "
                "preset's)");
  b.bind_unless("model.num_labels", m.num_labels, 0,
                "a sequence classifier with this many outputs (a score head in place of the LM "
                "head: 1 for a reward model, one per attribute for SteerLM's); 0 = a causal LM");
  b.bind_with<std::string>("model.labels", "",
                           "the classifier's output names, comma-separated (HF's id2label)",
                           [&](const std::string& t) {
                             if (!t.empty()) m.labels = split_commas(t);
                           });
  b.bind_with<std::string>("model.tied_embeddings", "",
                           "override: true/false, share embedding and LM head",
                           [&](const std::string& t) {
                             if (t.empty()) return;
                             if (t != "true" && t != "false")
                               fail("model.tied_embeddings: expected true or false, got '{}'", t);
                             m.tied_embeddings = t == "true";
                           });
  // RoPE scaling: a type resets the preset's scaling; the other keys refine it.
  RopeScaling& rs = m.rope_scaling;
  std::string scaling;  // the type given, "" = the preset's
  b.bind_with<std::string>(
      "model.rope_scaling.type", "",
      "override: RoPE scaling none, linear, llama3 or yarn (then the keys it uses; longrope "
      "comes with its factor lists from config.json)",
      [&](const std::string& t) {
        if (t.empty()) return;
        scaling = t;
        rs = RopeScaling{};
        rs.type = parse_rope_scaling_type(t, "model.rope_scaling.type");
      });
  bool factor = b.bind_unless("model.rope_scaling.factor", rs.factor, 0.0,
                              "override: context stretch of RoPE scaling");
  if (!scaling.empty() && rs.enabled() && !factor)
    fail("model.rope_scaling.factor: {} scaling needs a factor", scaling);
  b.bind_unless("model.rope_scaling.low_freq_factor", rs.low_freq_factor, 0.0,
                "override: llama3's low_freq_factor");
  b.bind_unless("model.rope_scaling.high_freq_factor", rs.high_freq_factor, 0.0,
                "override: llama3's high_freq_factor");
  b.bind_unless("model.rope_scaling.original_max_seq_len", rs.original_max_seq_len, 0,
                "override: context the model was pretrained on (llama3; yarn: 0 = max_seq_len)");
  b.bind_unless("model.rope_scaling.beta_fast", rs.beta_fast, 0.0,
                "override: yarn's beta_fast (its default 32)");
  b.bind_unless("model.rope_scaling.beta_slow", rs.beta_slow, 0.0,
                "override: yarn's beta_slow (its default 1)");
  b.bind_unless("model.rope_scaling.attention_factor", rs.attention_factor, 0.0,
                "override: yarn's cos/sin scale (0 = 0.1 ln(factor) + 1)");
  b.bind_unless("model.rope_scaling.mscale", rs.mscale, 0.0, "override: yarn's mscale (DeepSeek)");
  b.bind_unless("model.rope_scaling.mscale_all_dim", rs.mscale_all_dim, 0.0,
                "override: yarn's mscale_all_dim (DeepSeek)");
  b.bind_unless(
      "model.num_experts", m.num_experts, -1,
      "override: Mixture-of-Experts experts per layer (-1 = preset's; model.arch=mixtral)");
  b.bind_unless("model.num_experts_per_tok", m.num_experts_per_tok, 0,
                "override: experts each token is routed to (top-k)");
  b.bind_unless("model.moe_d_ff", m.moe_d_ff, -1,
                "override: each expert's MLP inner size (0 = model.d_ff; -1 = preset's)");
  b.bind_unless("model.moe_shared_d_ff", m.moe_shared_d_ff, -1,
                "override: the shared expert's MLP inner size, every token's besides its routed "
                "experts (0 = none; -1 = preset's)");
  b.bind_with<std::string>(
      "model.moe_shared_expert_gate", "",
      "override: true/false, scale the shared expert's output by "
      "sigmoid(x . w) (Qwen2-MoE: true)",
      [&](const std::string& t) {
        if (t.empty()) return;
        if (t != "true" && t != "false")
          fail("model.moe_shared_expert_gate: expected true or false, got '{}'", t);
        m.moe_shared_expert_gate = t == "true";
      });
  b.bind_with<std::string>("model.norm_topk_prob", "",
                           "override: true/false, renormalise the top-k router scores (Mixtral: "
                           "true)",
                           [&](const std::string& t) {
                             if (t.empty()) return;
                             if (t != "true" && t != "false")
                               fail("model.norm_topk_prob: expected true or false, got '{}'", t);
                             m.norm_topk_prob = t == "true";
                           });
  b.bind_unless("model.moe_score_func", m.moe_score_func, std::string(),
                "override: router scores softmax (Mixtral) or sigmoid");
  b.bind_unless("model.moe_aux_loss_coeff", m.moe_aux_loss_coeff, -1.0,
                "override: load-balancing loss coefficient (HF's router_aux_loss_coef; -1 = "
                "preset's)");
  b.bind_unless("model.moe_z_loss_coeff", m.moe_z_loss_coeff, -1.0,
                "override: router z-loss coefficient (-1 = preset's)");
  b.bind_unless("model.moe_capacity_factor", m.moe_capacity_factor, -1.0,
                "override: expert capacity factor, pairs over ceil(factor x tokens x k / experts) "
                "per expert dropped (0 = dropless; -1 = preset's)");
  b.bind_unless("model.moe_aux_loss_type", m.moe_aux_loss_type, std::string(),
                "override: balancing loss over the batch (global) or per sequence (seq, "
                "DeepSeek-V3)");
  b.bind_unless("model.moe_n_group", m.moe_n_group, 0,
                "override: expert groups of group-limited routing (DeepSeek-V3's n_group; 0 = "
                "preset's)");
  b.bind_unless("model.moe_topk_group", m.moe_topk_group, 0,
                "override: groups each token's experts come from (topk_group; 0 = preset's)");
  b.bind_unless("model.moe_routed_scaling", m.moe_routed_scaling, 0.0,
                "override: factor of the routed experts' weights (routed_scaling_factor; 0 = "
                "preset's)");
  b.bind_with<std::string>("model.moe_score_bias", "",
                           "override: true/false, an expert score-correction bias that chooses "
                           "(DeepSeek-V3's e_score_correction_bias)",
                           [&](const std::string& t) {
                             if (t.empty()) return;
                             if (t != "true" && t != "false")
                               fail("model.moe_score_bias: expected true or false, got '{}'", t);
                             m.moe_score_bias = t == "true";
                           });
  b.bind_unless("model.moe_bias_update_rate", m.moe_bias_update_rate, -1.0,
                "override: aux-loss-free balancing, the bias step per optimizer step (0 = off; "
                "-1 = preset's)");
  b.bind_unless("model.moe_first_dense_layers", m.moe_first_dense_layers, int64_t(-1),
                "override: leading layers with a dense MLP of model.d_ff (first_k_dense_replace; "
                "-1 = preset's)");
  b.bind_with<std::string>(
      "model.moe_dense_layers", "",
      "override: comma-separated layers with a dense MLP of model.d_ff among the MoE ones "
      "(Qwen-MoE's mlp_only_layers; 'none' for none)",
      [&](const std::string& t) {
        if (t.empty()) return;
        m.moe_dense_layers.clear();
        if (t == "none") return;
        size_t at = 0;
        while (at <= t.size()) {
          const size_t end = std::min(t.find(',', at), t.size());
          const std::string item = t.substr(at, end - at);
          char* stop = nullptr;
          const long long v = std::strtoll(item.c_str(), &stop, 10);
          if (item.empty() || *stop != '\0')
            fail("model.moe_dense_layers: expected comma-separated layer numbers, got '{}'", t);
          m.moe_dense_layers.push_back(v);
          at = end + 1;
        }
      });
  if (!b.reading()) return;
  derive_sizes(m, preset, width, heads, kv_heads, ffn);
  // Multi-head architectures (learned positions: GPT-2) follow n_head.
  if (m.architecture().block().learned_positions && !kv_heads) m.n_kv_head = m.n_head;
  m.validate();
}

ConfigSchema model_schema() {
  return schema_of([](ConfigBinder& b) {
    ModelConfig m;
    bind_model_keys(b, m);
  });
}

ModelConfig model_config_from(const Config& cfg) {
  ModelConfig m;
  ConfigReader r(cfg);
  bind_model_keys(r, m);
  return m;
}

}  // namespace nk
