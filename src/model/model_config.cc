#include "model/model_config.h"

#include "model/arch.h"

#include <fmt/ranges.h>

#include <map>

namespace nk {

const Architecture& ModelConfig::architecture() const {
  return find_architecture(arch);
}

int64_t ModelConfig::mlp_up_dim() const {
  return architecture().block().swiglu ? 2 * d_ff : d_ff;
}

void ModelConfig::validate(const std::string& p) const {
  const Architecture* a = nullptr;
  try {
    a = &architecture();
  } catch (const Error& e) {
    fail("{}arch: {}", p, e.what());
  }
  auto positive = [&](const char* key, int64_t v) {
    if (v <= 0) fail("{}{}: must be positive, got {}", p, key, v);
  };
  positive("vocab_size", vocab_size);
  positive("max_seq_len", max_seq_len);
  positive("n_layer", n_layer);
  positive("n_head", n_head);
  positive("n_kv_head", n_kv_head);
  positive("d_model", d_model);
  positive("d_ff", d_ff);
  if (d_model % n_head)
    fail("{}n_head: {} heads do not divide {}d_model = {}", p, n_head, p, d_model);
  if (n_head % n_kv_head)
    fail("{}n_kv_head: {} kv heads do not divide {}n_head = {}", p, n_kv_head, p, n_head);
  if (!a->block().learned_positions && head_dim() % 2)
    fail("{}n_head: RoPE needs an even head size, got {}", p, head_dim());
  if (sliding_window < 0)
    fail("{}sliding_window: must be 0 (full attention) or positive, got {}", p, sliding_window);
  if (!(norm_eps > 0)) fail("{}norm_eps: must be positive, got {}", p, norm_eps);
  if (!(rope_theta > 0)) fail("{}rope_theta: must be positive, got {}", p, rope_theta);
  if (!(init_std > 0)) fail("{}init_std: must be positive, got {}", p, init_std);
  if (a->block().learned_positions && rope_scaling.enabled())
    fail("{}rope_scaling.type: {} has learned positions, not rotary ones to scale", p, arch);
  rope_scaling.validate(p + "rope_scaling.");
  a->validate(*this, p);
}

double ModelConfig::train_flops(int64_t tokens, int64_t T) const {
  double C = double(d_model), L = double(n_layer);
  double mlp = (architecture().block().swiglu ? 3.0 : 2.0) * C * double(d_ff);
  double per_layer = 2.0 * (C * double(qkv_dim()) + double(n_head * head_dim()) * C + mlp) +
                     4.0 * double(T) * double(n_head * head_dim());
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

void add_model_keys(ConfigSchema& s) {
  s.add_string("model.preset", "gpt-tiny",
               fmt::format("named model: {}", fmt::join(model_preset_names(), ", ")));
  s.add_string("model.arch", "",
               fmt::format("override: architecture ({})", fmt::join(architecture_names(), ", ")));
  s.add_int("model.vocab_size", 0, "override: vocabulary size (0 = preset's or tokenizer's)");
  s.add_int("model.max_seq_len", 0, "override: longest sequence (positions) the model supports");
  s.add_int("model.n_layer", 0, "override: transformer layers");
  s.add_int("model.n_head", 0, "override: attention heads");
  s.add_int("model.n_kv_head", 0, "override: key/value heads (grouped-query attention)");
  s.add_int("model.d_model", 0, "override: hidden size");
  s.add_int("model.d_ff", 0, "override: MLP inner size");
  s.add_float("model.norm_eps", 0, "override: epsilon of LayerNorm/RMSNorm");
  s.add_float("model.rope_theta", 0, "override: RoPE base frequency");
  s.add_int("model.sliding_window", -1,
            "override: sliding-window attention over this many positions (0 = full; -1 = "
            "preset's)");
  s.add_string("model.tied_embeddings", "", "override: true/false, share embedding and LM head");
  s.add_string("model.rope_scaling.type", "",
               "override: RoPE scaling none, linear, llama3 or yarn (then the keys it uses)");
  s.add_float("model.rope_scaling.factor", 0, "override: context stretch of RoPE scaling");
  s.add_float("model.rope_scaling.low_freq_factor", 0, "override: llama3's low_freq_factor");
  s.add_float("model.rope_scaling.high_freq_factor", 0, "override: llama3's high_freq_factor");
  s.add_int("model.rope_scaling.original_max_seq_len", 0,
            "override: context the model was pretrained on (llama3; yarn: 0 = max_seq_len)");
  s.add_float("model.rope_scaling.beta_fast", 0, "override: yarn's beta_fast (its default 32)");
  s.add_float("model.rope_scaling.beta_slow", 0, "override: yarn's beta_slow (its default 1)");
  s.add_float("model.rope_scaling.attention_factor", 0,
              "override: yarn's cos/sin scale (0 = 0.1 ln(factor) + 1)");
  s.add_float("model.rope_scaling.mscale", 0, "override: yarn's mscale (DeepSeek)");
  s.add_float("model.rope_scaling.mscale_all_dim", 0, "override: yarn's mscale_all_dim (DeepSeek)");
}

ModelConfig model_config_from(const Config& cfg) {
  ModelConfig m = model_preset(cfg.get_string("model.preset"));
  if (auto a = cfg.get_string("model.arch"); !a.empty()) m.arch = a;
  auto set_int = [&](const char* key, int64_t& field) {
    if (int64_t v = cfg.get_int(key); v != 0) field = v;
  };
  set_int("model.vocab_size", m.vocab_size);
  set_int("model.max_seq_len", m.max_seq_len);
  set_int("model.n_layer", m.n_layer);
  set_int("model.n_head", m.n_head);
  set_int("model.n_kv_head", m.n_kv_head);
  set_int("model.d_model", m.d_model);
  set_int("model.d_ff", m.d_ff);
  if (double v = cfg.get_float("model.norm_eps"); v != 0) m.norm_eps = v;
  if (double v = cfg.get_float("model.rope_theta"); v != 0) m.rope_theta = v;
  if (int64_t v = cfg.get_int("model.sliding_window"); v != -1) m.sliding_window = v;
  if (auto t = cfg.get_string("model.tied_embeddings"); !t.empty()) {
    if (t != "true" && t != "false")
      fail("model.tied_embeddings: expected true or false, got '{}'", t);
    m.tied_embeddings = t == "true";
  }
  // RoPE scaling: a type resets the preset's scaling; the other keys refine it.
  RopeScaling& rs = m.rope_scaling;
  if (auto t = cfg.get_string("model.rope_scaling.type"); !t.empty()) {
    rs = RopeScaling{};
    rs.type = parse_rope_scaling_type(t, "model.rope_scaling.type");
    if (rs.enabled() && cfg.get_float("model.rope_scaling.factor") == 0)
      fail("model.rope_scaling.factor: {} scaling needs a factor", t);
  }
  auto set_float = [&](const char* key, double& field) {
    if (double v = cfg.get_float(key); v != 0) field = v;
  };
  set_float("model.rope_scaling.factor", rs.factor);
  set_float("model.rope_scaling.low_freq_factor", rs.low_freq_factor);
  set_float("model.rope_scaling.high_freq_factor", rs.high_freq_factor);
  set_int("model.rope_scaling.original_max_seq_len", rs.original_max_seq_len);
  set_float("model.rope_scaling.beta_fast", rs.beta_fast);
  set_float("model.rope_scaling.beta_slow", rs.beta_slow);
  set_float("model.rope_scaling.attention_factor", rs.attention_factor);
  set_float("model.rope_scaling.mscale", rs.mscale);
  set_float("model.rope_scaling.mscale_all_dim", rs.mscale_all_dim);
  // Multi-head architectures (learned positions: GPT-2) follow n_head.
  if (m.architecture().block().learned_positions && cfg.get_int("model.n_kv_head") == 0)
    m.n_kv_head = m.n_head;
  m.validate();
  return m;
}

}  // namespace nk
