#include "model/arch.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "core/json.h"
#include "core/limits.h"

namespace nk {

// Each architecture's file defines one of these.
const Architecture& gpt2_architecture();
const Architecture& llama_architecture();
const Architecture& qwen2_architecture();
const Architecture& mistral_architecture();
const Architecture& mixtral_architecture();
const Architecture& qwen3_architecture();
const Architecture& qwen2_moe_architecture();
const Architecture& qwen3_moe_architecture();
const Architecture& dots1_architecture();
const Architecture& deepseek_v2_architecture();
const Architecture& deepseek_v3_architecture();
const Architecture& phi3_architecture();
const Architecture& gemma2_architecture();
const Architecture& gemma3_architecture();
const Architecture& glm4_moe_architecture();

const std::vector<const Architecture*>& architectures() {
  static const std::vector<const Architecture*> all = {
      &gpt2_architecture(),        &llama_architecture(),       &qwen2_architecture(),
      &mistral_architecture(),     &mixtral_architecture(),     &qwen3_architecture(),
      &qwen2_moe_architecture(),   &qwen3_moe_architecture(),   &dots1_architecture(),
      &deepseek_v2_architecture(), &deepseek_v3_architecture(), &phi3_architecture(),
      &gemma2_architecture(),      &gemma3_architecture(),      &glm4_moe_architecture(),
  };
  return all;
}

std::vector<std::string> architecture_names() {
  std::vector<std::string> names;
  for (const Architecture* a : architectures()) names.push_back(a->name());
  return names;
}

const Architecture& find_architecture(const std::string& name) {
  for (const Architecture* a : architectures())
    if (a->name() == name) return *a;
  fail("unknown architecture '{}' (expected one of: {})", name,
       fmt::join(architecture_names(), ", "));
}

int64_t Architecture::derived_d_ff(const ModelConfig& preset, int64_t d_model,
                                   std::string& rule) const {
  int64_t multiple = 1;
  while (multiple < 256 && preset.d_ff % (2 * multiple) == 0) multiple *= 2;
  // ceil(d_ff / d_model x d_model'), then up to the multiple; exact in integers.
  const int64_t scaled = (preset.d_ff * d_model + preset.d_model - 1) / preset.d_model;
  rule = fmt::format("the preset's {} / {} of d_model, rounded up to a multiple of {}", preset.d_ff,
                     preset.d_model, multiple);
  return (scaled + multiple - 1) / multiple * multiple;
}

void Architecture::add_params(ParamLayout& p, const ModelConfig& c) const {
  decoder_params(p, c, c.block());
}

std::string gguf_norm_eps_key(const BlockSpec& spec) {
  return spec.rms_norm ? "attention.layer_norm_rms_epsilon" : "attention.layer_norm_epsilon";
}

std::string Architecture::hf_classifier_class() const {
  const std::string lm = "ForCausalLM", cls = hf_classes().front().first;
  if (!cls.ends_with(lm)) return "";
  return cls.substr(0, cls.size() - lm.size()) + "ForSequenceClassification";
}

std::vector<ExternalTensor> hf_model_tensors(const ModelConfig& c, const std::string& prefix) {
  std::vector<ExternalTensor> t = c.architecture().hf_tensors(c, prefix);
  if (!c.classifier()) return t;
  std::erase_if(t, [](const ExternalTensor& e) { return e.param == "lm_head.weight"; });
  t.push_back({"score.weight", "score.weight", "", false, 0});
  return t;
}

ParamLayout model_layout(const ModelConfig& c, const std::vector<std::string>& frozen,
                         const std::vector<std::string>& quantized) {
  c.validate();  // bounded shapes (core/limits.h) before anything is sized from them
  ParamLayout p;
  c.architecture().add_params(p, c);
  add_adapter_params(p, c);
  for (const std::string& name : frozen) p.freeze(name);
  for (const std::string& name : quantized) p.quantize(name);
  p.finalize();
  return p;
}

void decoder_params(ParamLayout& p, const ModelConfig& c, const BlockSpec& spec) {
  const float std = float(c.init_std);
  // Output projections write into the residual stream: scaled by 1/sqrt(2L).
  const float out_std = float(c.init_std / std::sqrt(2.0 * double(c.n_layer)));
  const int64_t C = c.d_model, D = c.head_dim(), Q = c.n_head * D, KV = c.n_kv_head * D;
  const ParamOptions rows{Split::Rows, {}}, cols{Split::Cols, {}};
  // Vocabulary-parallel tables, padded under tensor parallelism (ModelConfig::padded_vocab_size).
  const ParamOptions vocab{Split::Rows, {}, false, c.make_vocab_size_divisible_by};
  const ParamOptions qkv{Split::Rows, {{"q", Q}, {"k", KV}, {"v", KV}}};
  const ParamOptions up =
      spec.swiglu ? ParamOptions{Split::Rows, {{"gate", c.d_ff}, {"up", c.d_ff}}} : rows;
  auto L = [](int64_t l, const char* name) { return fmt::format("h.{}.{}", l, name); };
  // (1 + w) norms start at w = 0: a scale of 1, as ones do for plain ones.
  const Init gain = spec.norm_offset ? Init::Zeros : Init::Ones;
  auto norm = [&](const std::string& base) {
    p.add(base + ".weight", {C}, gain);
    if (!spec.rms_norm) p.add(base + ".bias", {C}, Init::Zeros);
  };
  p.add("wte", {c.vocab_size, C}, Init::Normal, std, vocab);
  if (spec.learned_positions) p.add("wpe", {c.max_seq_len, C}, Init::Normal, std);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    norm(L(l, "ln1"));
    if (spec.latent_attention) {
      latent_attention_params(p, c, l);
    } else {
      p.add(L(l, "attn.qkv.weight"), {c.qkv_dim(), C}, Init::Normal, std, qkv);
      if (spec.qkv_bias) p.add(L(l, "attn.qkv.bias"), {c.qkv_dim()}, Init::Zeros, 0.f, qkv);
      if (spec.qk_norm) {
        p.add(L(l, "attn.q_norm.weight"), {D}, gain);
        p.add(L(l, "attn.k_norm.weight"), {D}, gain);
      }
    }
    p.add(L(l, "attn.proj.weight"), {C, c.n_head * c.out_head_dim()}, Init::Normal, out_std, cols);
    if (spec.proj_bias) p.add(L(l, "attn.proj.bias"), {C}, Init::Zeros);
    if (spec.post_norms) norm(L(l, "ln_attn_out"));
    norm(L(l, "ln2"));
    if (c.moe_layer(l)) {
      moe_params(p, c, l);
      if (spec.post_norms) norm(L(l, "ln_mlp_out"));
      continue;
    }
    p.add(L(l, "mlp.up.weight"), {c.mlp_up_dim(), C}, Init::Normal, std, up);
    if (spec.proj_bias) p.add(L(l, "mlp.up.bias"), {c.mlp_up_dim()}, Init::Zeros, 0.f, up);
    p.add(L(l, "mlp.down.weight"), {C, c.d_ff}, Init::Normal, out_std, cols);
    if (spec.proj_bias) p.add(L(l, "mlp.down.bias"), {C}, Init::Zeros);
    if (spec.post_norms) norm(L(l, "ln_mlp_out"));
  }
  norm("ln_f");
  if (c.classifier())  // HF's *ForSequenceClassification: `score`, no LM head
    p.add("score.weight", {c.num_labels, C}, Init::Normal, std);
  else if (!c.tied_embeddings)
    p.add("lm_head.weight", {c.vocab_size, C}, Init::Normal, std, vocab);
  if (c.value_head) {  // a linear layer's start, as TRL's ValueHead
    p.add("value_head.weight", {1, C}, Init::Normal, std);
    p.add("value_head.bias", {1}, Init::Zeros);
  }
}

void latent_attention_params(ParamLayout& p, const ModelConfig& c, int64_t l) {
  const float std = float(c.init_std);
  const int64_t C = c.d_model, H = c.n_head, D = c.head_dim(), r = c.qk_rope_head_dim;
  const std::string h = fmt::format("h.{}.attn.", l);
  // Under tensor parallelism the per-head projections (q or q_b, kv_b) are
  // split by rows, whole heads to a rank (their rows are head-major); the
  // low-rank projections and their norms are every rank's
  // (Transformer::tensor_parallel_partial_grads sums their gradients).
  const ParamOptions heads{Split::Rows, {}};
  if (c.q_lora_rank > 0) {
    p.add(h + "q_a.weight", {c.q_lora_rank, C}, Init::Normal, std);
    p.add(h + "q_a_norm.weight", {c.q_lora_rank}, Init::Ones);
    p.add(h + "q_b.weight", {H * D, c.q_lora_rank}, Init::Normal, std, heads);
  } else {
    p.add(h + "q.weight", {H * D, C}, Init::Normal, std, heads);
  }
  p.add(h + "kv_a.weight", {c.kv_lora_rank + r, C}, Init::Normal, std);
  p.add(h + "kv_a_norm.weight", {c.kv_lora_rank}, Init::Ones);
  p.add(h + "kv_b.weight", {H * (D - r + c.v_head_dim), c.kv_lora_rank}, Init::Normal, std, heads);
}

void moe_params(ParamLayout& p, const ModelConfig& c, int64_t l) {
  const int64_t E = c.num_experts, C = c.d_model, F = c.expert_d_ff();
  const float std = float(c.init_std);
  const float out_std = float(c.init_std / std::sqrt(2.0 * double(c.n_layer)));
  // Split over the expert-parallel group by whole experts
  // (ParamLayout::shard_experts), and each expert over the tensor-parallel
  // group as a SwiGLU MLP is: gate | up by rows, down by columns.
  ParamOptions up{Split::Experts, {}}, down{Split::Experts, {}};
  up.expert_split = Split::Rows;
  down.expert_split = Split::Cols;
  for (int64_t e = 0; e < E; ++e) {
    up.parts.push_back({fmt::format("e{}.gate", e), F});
    up.parts.push_back({fmt::format("e{}.up", e), F});
    down.parts.push_back({fmt::format("e{}", e), C});
  }
  const std::string h = fmt::format("h.{}.moe.", l);
  p.add(h + "router.weight", {E, C}, Init::Normal, std);
  p.add(h + "up.weight", {E * 2 * F, C}, Init::Normal, std, up);
  p.add(h + "down.weight", {E * C, F}, Init::Normal, out_std, down);
  // DeepSeek-V3's score-correction bias: moved by the trainer, not the optimizer.
  if (c.has_score_bias()) {
    p.add(h + "score_bias", {E}, Init::Zeros);
    p.freeze(h + "score_bias");
  }
  if (c.moe_shared_d_ff > 0) {
    const int64_t Fs = c.moe_shared_d_ff;
    p.add(h + "shared_up.weight", {2 * Fs, C}, Init::Normal, std,
          ParamOptions{Split::Rows, {{"gate", Fs}, {"up", Fs}}});
    p.add(h + "shared_down.weight", {C, Fs}, Init::Normal, out_std, ParamOptions{Split::Cols, {}});
    if (c.moe_shared_expert_gate) p.add(h + "shared_gate.weight", {1, C}, Init::Normal, std);
  }
}

namespace {

// Layer l's MoE tensors, Nekton params under h ("h.L."), HF names under m
// ("model.layers.L.").
void qwen_moe_layer_tensors(const ModelConfig& c, const std::string& h, const std::string& m,
                            std::vector<ExternalTensor>& out) {
  const std::string x = m + "mlp.";
  out.push_back({x + "gate.weight", h + "moe.router.weight", "", false, 0});
  for (int64_t e = 0; e < c.num_experts; ++e) {
    const std::string ex = fmt::format("{}experts.{}.", x, e);
    out.push_back({ex + "gate_proj.weight", h + "moe.up.weight", fmt::format("e{}.gate", e)});
    out.push_back({ex + "up_proj.weight", h + "moe.up.weight", fmt::format("e{}.up", e)});
  }
  for (int64_t e = 0; e < c.num_experts; ++e)
    out.push_back({fmt::format("{}experts.{}.down_proj.weight", x, e), h + "moe.down.weight",
                   fmt::format("e{}", e)});
  if (c.moe_shared_d_ff == 0) return;
  out.push_back({x + "shared_expert.gate_proj.weight", h + "moe.shared_up.weight", "gate"});
  out.push_back({x + "shared_expert.up_proj.weight", h + "moe.shared_up.weight", "up"});
  out.push_back({x + "shared_expert.down_proj.weight", h + "moe.shared_down.weight", ""});
  if (c.moe_shared_expert_gate)
    out.push_back({x + "shared_expert_gate.weight", h + "moe.shared_gate.weight", ""});
}

}  // namespace

std::vector<ExternalTensor> qwen_moe_hf_tensors(const ModelConfig& c,
                                                const std::vector<ExternalTensor>& dense) {
  std::vector<ExternalTensor> out;
  const std::string ln2 = "ln2.weight";
  auto layer_of = [](const std::string& param) {
    return std::stoll(param.substr(2, param.find('.', 2) - 2));
  };
  for (const ExternalTensor& t : dense) {
    const bool mlp = t.param.find(".mlp.") != std::string::npos;
    if (mlp && c.moe_layer(layer_of(t.param))) continue;  // the MoE block's instead
    out.push_back(t);
    if (!t.param.ends_with(ln2) || !c.moe_layer(layer_of(t.param))) continue;
    qwen_moe_layer_tensors(c, t.param.substr(0, t.param.size() - ln2.size()),
                           t.name.substr(0, t.name.find("post_attention_layernorm")), out);
  }
  return out;
}

std::vector<ExternalTensor> moe_gguf_tensors(const ModelConfig& c,
                                             const std::vector<ExternalTensor>& dense) {
  std::vector<ExternalTensor> out;
  const std::string ln2 = "ln2.weight", ffn_norm = "ffn_norm.weight";
  auto layer_of = [](const std::string& param) {
    return std::stoll(param.substr(2, param.find('.', 2) - 2));
  };
  for (const ExternalTensor& t : dense) {
    const bool mlp = t.param.find(".mlp.") != std::string::npos;
    if (mlp && c.moe_layer(layer_of(t.param))) continue;  // the MoE block's instead
    out.push_back(t);
    if (!t.param.ends_with(ln2) || !c.moe_layer(layer_of(t.param))) continue;
    const std::string h = t.param.substr(0, t.param.size() - ln2.size());
    const std::string b = t.name.substr(0, t.name.size() - ffn_norm.size());
    const int64_t E = c.num_experts;
    out.push_back({b + "ffn_gate_inp.weight", h + "moe.router.weight", "", false, 0});
    out.push_back({b + "ffn_gate_exps.weight", h + "moe.up.weight", "e{}.gate", false, 0, E});
    out.push_back({b + "ffn_up_exps.weight", h + "moe.up.weight", "e{}.up", false, 0, E});
    out.push_back({b + "ffn_down_exps.weight", h + "moe.down.weight", "e{}", false, 0, E});
    if (c.has_score_bias()) out.push_back({b + "exp_probs_b.bias", h + "moe.score_bias", ""});
    if (c.moe_shared_d_ff == 0) continue;
    if (c.moe_shared_expert_gate)
      out.push_back(
          {b + "ffn_gate_inp_shexp.weight", h + "moe.shared_gate.weight", "", false, 0, 0, true});
    out.push_back({b + "ffn_gate_shexp.weight", h + "moe.shared_up.weight", "gate", false, 0});
    out.push_back({b + "ffn_up_shexp.weight", h + "moe.shared_up.weight", "up", false, 0});
    out.push_back({b + "ffn_down_shexp.weight", h + "moe.shared_down.weight", "", false, 0});
  }
  return out;
}

void hf_read_qwen_moe(const HfConfigReader& h, ModelConfig& c, bool shared_expert) {
  c.num_experts = h.positive("num_experts", limits::kMaxExperts, "experts");
  c.num_experts_per_tok = h.positive("num_experts_per_tok", limits::kMaxExperts, "experts");
  if (c.num_experts_per_tok > c.num_experts)
    h.fail_at(fmt::format("'num_experts_per_tok' = {} exceeds 'num_experts' = {}",
                          c.num_experts_per_tok, c.num_experts));
  c.moe_d_ff = h.positive("moe_intermediate_size", limits::kFfn, "MLP units");
  c.norm_topk_prob = h.boolean("norm_topk_prob", false);
  c.moe_score_func = "softmax";
  c.moe_aux_loss_coeff = 0.001;
  if (h.has("router_aux_loss_coef")) {
    const nlohmann::json& v = h.at("router_aux_loss_coef");
    if (!v.is_number() || !(v.get<double>() >= 0))
      h.fail_at("field 'router_aux_loss_coef' must be a number >= 0, got " + v.dump());
    c.moe_aux_loss_coeff = v.get<double>();
  }
  // HF makes layer l dense (an MLP of intermediate_size) when l is in
  // mlp_only_layers or (l + 1) is not a multiple of decoder_sparse_step.
  const int64_t step = h.integer("decoder_sparse_step", 1);
  if (step < 1)
    h.fail_at(fmt::format("field 'decoder_sparse_step' must be positive, got {}", step));
  std::vector<int64_t> only;
  if (h.has("mlp_only_layers")) {
    const nlohmann::json& v = h.at("mlp_only_layers");
    if (!v.is_array()) h.fail_at("field 'mlp_only_layers' must be a list, got " + v.dump());
    for (const nlohmann::json& x : v) {
      const int64_t l = json_int(x, h.where(), "mlp_only_layers");
      if (l < 0 || l >= c.n_layer)
        h.fail_at(
            fmt::format("field 'mlp_only_layers' names layer {}, not in [0, {})", l, c.n_layer));
      only.push_back(l);
    }
  }
  c.moe_first_dense_layers = 0;
  c.moe_dense_layers.clear();
  for (int64_t l = 0; l < c.n_layer; ++l)
    if (std::find(only.begin(), only.end(), l) != only.end() || (l + 1) % step != 0)
      c.moe_dense_layers.push_back(l);
  if (int64_t(c.moe_dense_layers.size()) == c.n_layer)
    h.fail_at("every layer is dense (decoder_sparse_step, mlp_only_layers): no MoE layer");
  if (h.boolean("use_sliding_window", false))
    h.unsupported("use_sliding_window", "sliding-window attention is not supported");
  c.moe_shared_d_ff = 0;
  c.moe_shared_expert_gate = false;
  if (shared_expert) {
    c.moe_shared_d_ff = h.positive("shared_expert_intermediate_size", limits::kFfn, "MLP units");
    c.moe_shared_expert_gate = true;
  }
}

void hf_write_qwen_moe(const ModelConfig& c, nlohmann::ordered_json& j, bool shared_expert) {
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  j["max_window_layers"] = c.n_layer;
  j["attention_dropout"] = 0.0;
  j["decoder_sparse_step"] = 1;  // the dense layers listed in mlp_only_layers
  j["moe_intermediate_size"] = c.expert_d_ff();
  if (shared_expert) j["shared_expert_intermediate_size"] = c.moe_shared_d_ff;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["num_experts"] = c.num_experts;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["output_router_logits"] = false;
  j["router_aux_loss_coef"] = c.moe_aux_loss_coeff;
  nlohmann::ordered_json dense = nlohmann::ordered_json::array();
  for (int64_t l = 0; l < c.n_layer; ++l)
    if (!c.moe_layer(l)) dense.push_back(l);
  j["mlp_only_layers"] = dense;
}

// ---- HfConfigReader ----

int64_t HfConfigReader::integer(const char* key) const {
  if (!has(key)) fail("{}: missing field '{}'", where_, key);
  return json_int(j_.at(key), where_, key);
}

int64_t HfConfigReader::positive(const char* key, int64_t limit, const char* what) const {
  int64_t v = integer(key);
  if (v <= 0) fail("{}: field '{}' must be positive, got {}", where_, key, v);
  check_limit(where_, "field '" + std::string(key) + "'", v, limit, what);
  return v;
}

double HfConfigReader::number(const char* key, double def) const {
  if (!has(key)) return def;
  const nlohmann::json& v = j_.at(key);
  if (!v.is_number()) fail("{}: field '{}' must be a number, got {}", where_, key, v.dump());
  double d = v.get<double>();
  if (!(d > 0) || !std::isfinite(d))
    fail("{}: field '{}' must be a positive number, got {}", where_, key, v.dump());
  return d;
}

bool HfConfigReader::boolean(const char* key, bool def) const {
  if (!has(key)) return def;
  const nlohmann::json& v = j_.at(key);
  if (!v.is_boolean()) fail("{}: field '{}' must be true or false, got {}", where_, key, v.dump());
  return v.get<bool>();
}

std::string HfConfigReader::string(const char* key, const std::string& def) const {
  if (!has(key)) return def;
  const nlohmann::json& v = j_.at(key);
  if (!v.is_string()) fail("{}: field '{}' must be a string, got {}", where_, key, v.dump());
  return v.get<std::string>();
}

void HfConfigReader::unsupported(const char* key, const std::string& why) const {
  fail("{}: unsupported '{}' = {}: {}", where_, key, j_.at(key).dump(), why);
}

void HfConfigReader::fail_at(const std::string& what) const {
  fail("{}: {}", where_, what);
}

}  // namespace nk
