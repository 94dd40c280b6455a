#include "model/peft.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "core/limits.h"
#include "model/arch.h"
#include "model/transformer.h"
#include "nn/adapters.h"

namespace nk {

namespace {

// Megatron's name of a Nekton linear layer ("" for none of the four).
std::string megatron_name(const std::string& linear) {
  const char* names[] = {"linear_qkv", "linear_proj", "linear_fc1",
                         "linear_fc2", "linear_fc1",  "linear_fc2"};
  const int slot = adapter_linear_slot(linear);
  return slot < 0 ? "" : names[slot];
}

// A MoE layer's router or shared-expert gate: linear layers of the block
// that take no adapter.
bool is_router(const std::string& param) {
  return param.ends_with(".moe.router.weight") || param.ends_with(".moe.shared_gate.weight");
}

bool matches(const std::string& target, const AdaptedModule& t) {
  return target == "all-linear" || target == t.module || t.module.ends_with("." + target) ||
         target == megatron_name(t.linear);
}

// Every linear layer of the blocks an adapter could go on, one entry per
// Hugging Face module (a fused part or a whole layer), in checkpoint order.
std::vector<AdaptedModule> adaptable_modules(const ModelConfig& c) {
  const Architecture& arch = c.architecture();
  ParamLayout base;
  arch.add_params(base, c);
  std::vector<AdaptedModule> out;
  for (const ExternalTensor& e : arch.hf_tensors(c, arch.hf_tensor_prefix())) {
    if (!e.param.starts_with("h.") || !e.param.ends_with(".weight") || !e.name.ends_with(".weight"))
      continue;
    const ParamInfo& p = base.find(e.param);
    if (p.shape.size() != 2 || megatron_name(e.param.substr(0, e.param.size() - 7)).empty())
      continue;
    AdaptedModule t;
    t.linear = e.param.substr(0, e.param.size() - 7);
    t.part = e.part;
    t.module = e.name.substr(0, e.name.size() - 7);
    t.in = p.shape[1];
    t.col0 = e.part.empty() ? 0 : p.part(e.part).row0;
    t.rows = e.part.empty() ? p.shape[0] : p.part(e.part).rows;
    t.out = p.shape[0];
    out.push_back(t);
  }
  return out;
}

// The Hugging Face module paths of c's routers (and shared-expert gates).
std::vector<std::pair<std::string, std::string>> routers_of(const ModelConfig& c) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!c.is_moe()) return out;
  const Architecture& arch = c.architecture();
  for (const ExternalTensor& e : arch.hf_tensors(c, arch.hf_tensor_prefix()))
    if (is_router(e.param) && e.name.ends_with(".weight"))
      out.push_back({e.param, e.name.substr(0, e.name.size() - 7)});
  return out;
}

// The modules `targets` select (each must select one); `key` names the
// setting in errors.
std::vector<bool> select(const std::vector<AdaptedModule>& all,
                         const std::vector<std::string>& targets, const ModelConfig& c,
                         const char* key) {
  std::vector<bool> chosen(all.size(), false);
  for (const std::string& target : targets) {
    bool any = false;
    for (size_t i = 0; i < all.size(); ++i)
      if (matches(target, all[i])) chosen[i] = any = true;
    if (any) continue;
    for (const auto& [param, module] : routers_of(c))
      if (target == module || module.ends_with("." + target))
        fail(
            "{}: '{}' names a Mixture-of-Experts router ({}), which takes no adapter; "
            "peft.train_router=true trains the routers whole",
            key, target, module);
    std::vector<std::string> names;  // the short names of layer 0's modules (expert 0's)
    for (const AdaptedModule& t : all)
      if (t.linear.starts_with("h.0.") && adapted_expert(t) <= 0)
        names.push_back(t.module.substr(t.module.rfind('.') + 1));
    fail(
        "{}: '{}' matches no linear layer of this {} model (its modules: {}; Megatron's names: "
        "linear_qkv, linear_proj, linear_fc1, linear_fc2; or all-linear)",
        key, target, c.architecture().display_name(), fmt::join(names, ", "));
  }
  return chosen;
}

int64_t layer_of(const std::string& linear) {
  return std::stoll(linear.substr(2, linear.find('.', 2) - 2));
}

}  // namespace

double LoraConfig::scale() const {
  return rslora ? alpha / std::sqrt(double(rank)) : alpha / double(rank);
}

Ia3Config default_ia3(const ModelConfig& c) {
  Ia3Config d;
  if (c.arch == "gpt2") {
    d.target_modules = {"c_attn", "mlp.c_proj"};
    d.feedforward_modules = {"mlp.c_proj"};
  } else {
    d.target_modules = {"k_proj", "v_proj", "down_proj"};
    d.feedforward_modules = {"down_proj"};
  }
  return d;
}

std::string AdaptedModule::a_name() const {
  return linear + ".lora_a" + (part.empty() || adapted_expert(*this) >= 0 ? "" : "." + part);
}

std::string AdaptedModule::b_name() const {
  return linear + ".lora_b" + (part.empty() || adapted_expert(*this) >= 0 ? "" : "." + part);
}

std::string AdaptedModule::lora_part() const {
  return adapted_expert(*this) >= 0 ? part : "";
}

Tensor lora_rows(const ParamInfo& p, const Tensor& whole, const std::string& part) {
  if (part.empty()) return whole;
  const ParamPart& q = p.part(part);
  return whole.narrow0(q.row0, q.rows);
}

std::string AdaptedModule::ia3_name() const {
  if (feedforward) return linear + ".ia3_in";
  return linear + ".ia3" + (part.empty() ? "" : "." + part);
}

std::string AdaptedModule::adapter_name(const char* tensor) const {
  return linear + ".adapter." + tensor;
}

std::vector<std::string> prompt_encoder_layers() {
  return {"prompt.mlp.0", "prompt.mlp.2", "prompt.mlp.4"};  // PEFT's mlp_head indices
}

std::vector<AdaptedModule> lora_targets(const ModelConfig& c) {
  if (!c.lora.enabled()) return {};
  const std::vector<AdaptedModule> all = adaptable_modules(c);
  const std::vector<bool> chosen = select(all, c.lora.target_modules, c, "peft.target_modules");
  std::vector<AdaptedModule> out;
  for (size_t i = 0; i < all.size(); ++i)
    if (chosen[i]) out.push_back(all[i]);
  return out;
}

std::vector<AdaptedModule> ia3_targets(const ModelConfig& c) {
  if (!c.ia3.enabled()) return {};
  const std::vector<AdaptedModule> all = adaptable_modules(c);
  const std::vector<bool> chosen = select(all, c.ia3.target_modules, c, "peft.target_modules"),
                          ff =
                              select(all, c.ia3.feedforward_modules, c, "peft.feedforward_modules");
  std::vector<AdaptedModule> out;
  for (size_t i = 0; i < all.size(); ++i) {
    if (ff[i] && !chosen[i])
      fail("peft.feedforward_modules: '{}' is not among peft.target_modules", all[i].module);
    if (!chosen[i]) continue;
    AdaptedModule t = all[i];
    t.feedforward = ff[i];
    // An input scale belongs to a whole layer: a fused part's input is its
    // siblings' too.
    if (t.feedforward && !t.part.empty())
      fail(
          "peft.feedforward_modules: '{}' is one part of a fused layer ({}); IA3 scales the "
          "input of whole layers only (o_proj, down_proj; GPT-2's c_proj)",
          t.module, t.linear);
    out.push_back(t);
  }
  return out;
}

std::vector<AdaptedModule> bottleneck_targets(const ModelConfig& c) {
  if (!c.bottleneck.enabled()) return {};
  const std::vector<AdaptedModule> all = adaptable_modules(c);
  const std::vector<bool> chosen =
      select(all, c.bottleneck.target_modules, c, "peft.target_modules");
  // An adapter follows a whole layer's output. A fused layer (Llama's
  // q|k|v, gate|up) is one when every part of it is chosen (linear_qkv,
  // linear_fc1, all-linear), named as Megatron names it under the parts'
  // module path ("model.layers.0.mlp.linear_fc1"); a part alone cannot be.
  std::vector<AdaptedModule> out;
  for (size_t i = 0; i < all.size(); ++i) {
    const AdaptedModule& t = all[i];
    if (!chosen[i] || (!out.empty() && out.back().linear == t.linear)) continue;
    for (size_t j = 0; j < all.size(); ++j)
      if (all[j].linear == t.linear && !chosen[j])
        fail(
            "peft.target_modules: '{}' is one part of a fused layer ({}) whose other parts are "
            "not chosen; a bottleneck adapter follows a whole layer's output (name them all, or "
            "Megatron's linear_qkv, linear_proj, linear_fc1, linear_fc2)",
            t.module, t.linear);
    AdaptedModule w = t;
    if (!t.part.empty()) {
      w.module = t.module.substr(0, t.module.rfind('.') + 1) + megatron_name(t.linear);
      w.part.clear();
      w.col0 = 0;
      w.rows = t.out;
    }
    out.push_back(w);
  }
  return out;
}

int adapter_linear_slot(const std::string& linear) {
  const char* suffixes[] = {".attn.qkv", ".attn.proj", ".mlp.up", ".mlp.down"};
  for (int i = 0; i < 4; ++i)
    if (linear.ends_with(suffixes[i])) return i;
  // A MoE layer has no dense MLP: its experts take the MLP's slots.
  const char* moe[] = {".moe.up", ".moe.down", ".moe.shared_up", ".moe.shared_down"};
  for (int i = 0; i < 4; ++i)
    if (linear.ends_with(moe[i])) return 2 + i;
  return -1;
}

int64_t adapted_expert(const AdaptedModule& t) {
  if (!t.linear.ends_with(".moe.up") && !t.linear.ends_with(".moe.down")) return -1;
  return std::stoll(t.part.substr(
      1, t.part.find('.') == std::string::npos ? std::string::npos : t.part.find('.') - 1));
}

std::vector<std::pair<std::string, std::string>> router_modules(const ModelConfig& c) {
  return routers_of(c);
}

AdapterSizes adapter_sizes(const ModelConfig& c, int64_t expert_ranks) {
  AdapterSizes s;
  if (!c.lora.enabled() && !c.ia3.enabled() && !c.bottleneck.enabled()) return s;
  s.rank = c.lora.rank;
  s.dim = c.bottleneck.dim;
  s.saved.assign(size_t(c.n_layer), {});
  s.saved_f32.assign(size_t(c.n_layer), {});
  s.adapted.assign(size_t(c.n_layer), {});
  auto note = [&](const AdaptedModule& t) {
    const size_t l = size_t(layer_of(t.linear)), slot = size_t(adapter_linear_slot(t.linear));
    s.adapted[l][slot] = true;
    s.max_rows = std::max(s.max_rows, t.rows);
    s.max_in = std::max(s.max_in, t.in);
    s.max_out = std::max(s.max_out, t.out);
    return std::pair{l, slot};
  };
  // The experts' modules: per token, k rows of the most parts any one
  // expert of the layer has.
  std::map<std::tuple<size_t, size_t, int64_t>, int64_t> expert_parts;
  for (const AdaptedModule& t : lora_targets(c)) {
    auto [l, slot] = note(t);
    if (const int64_t e = adapted_expert(t); e >= 0) {
      const int64_t parts = ++expert_parts[{l, slot, e}];
      s.row_factor = c.num_experts_per_tok * expert_ranks;
      s.saved[l][slot] = std::max(s.saved[l][slot], s.row_factor * parts * s.rank);
    } else {
      s.saved[l][slot] += s.rank;
    }
  }
  for (const AdaptedModule& t : ia3_targets(c)) note(t);
  for (const AdaptedModule& t : bottleneck_targets(c)) {
    auto [l, slot] = note(t);
    s.saved[l][slot] += t.out + s.dim;
    s.saved_f32[l][slot] += 2;
  }
  return s;
}

std::unique_ptr<nn::AdapterScratch> make_adapter_scratch(const ModelConfig& c,
                                                         const AdapterSizes& s, int64_t rows,
                                                         DType dtype, Device device,
                                                         bool training) {
  if (!s.any()) return nullptr;
  rows *= s.row_factor;
  auto flat = [&](int64_t n) { return Tensor::empty({rows * n}, dtype, device); };
  auto w = std::make_unique<nn::AdapterScratch>();
  w->training = training;
  const bool ia3 = c.ia3.enabled();
  bool ia3_in = false;
  for (const AdaptedModule& t : ia3_targets(c)) ia3_in |= t.feedforward;
  // A bottleneck adapter's: its input gradient (z), its LayerNorm's output
  // (xd) and gradient (dx), silu's output and W_out's input gradient (dh).
  const int64_t bn_out = s.dim > 0 ? s.max_out : 0;
  w->z = flat(std::max({c.lora.enabled() ? s.max_rows : 0, ia3 ? s.max_out : 0, bn_out}));
  if (s.rank > 0 || s.dim > 0) w->dh = flat(std::max(s.rank, 2 * s.dim));
  w->dx = flat(std::max(s.max_in, bn_out));
  if ((training && c.lora.dropout > 0) || ia3_in || s.dim > 0)
    w->xd = flat(std::max(s.max_in, bn_out));
  if (ia3 && training) w->base = flat(s.max_rows);
  return w;
}

std::string adapter_method(const ModelConfig& c) {
  return c.lora.enabled()         ? "LoRA"
         : c.ia3.enabled()        ? "IA3"
         : c.bottleneck.enabled() ? "bottleneck adapters"
         : c.prompt.enabled()     ? "p-tuning"
                                  : "";
}

void validate_adapters(const ModelConfig& c, const std::string& prefix) {
  const LoraConfig& l = c.lora;
  if (int(l.enabled()) + c.ia3.enabled() + c.bottleneck.enabled() + c.prompt.enabled() > 1)
    fail("{}method: a model takes one kind of adapter (LoRA, IA3, bottleneck or p-tuning)", prefix);
  // Before any target is matched: a MoE model's experts take LoRA only.
  if (c.is_moe() && (c.ia3.enabled() || c.bottleneck.enabled() || c.prompt.enabled()))
    fail(
        "peft.method: {} on a Mixture-of-Experts model (model.num_experts = {}) are not supported "
        "yet (LoRA is: peft.method=lora)",
        c.ia3.enabled()          ? "IA3 adapters"
        : c.bottleneck.enabled() ? "bottleneck adapters"
                                 : "p-tuning",
        c.num_experts);
  if (l.enabled()) {
    check_limit("", prefix + "lora_rank", l.rank, limits::kHidden, "ranks");
    if (!(l.alpha > 0) || !std::isfinite(l.alpha))
      fail("{}lora_alpha: must be a positive number, got {}", prefix, l.alpha);
    // PEFT's scalings are about 0.5 to 64 in practice; far beyond, the
    // adapted layers' outputs overflow and every logit is NaN.
    if (l.scale() > kMaxLoraScale)
      fail(
          "{}lora_alpha: {} gives a LoRA scaling ({}) of {}, beyond {}: the adapted layers' "
          "outputs would overflow",
          prefix, l.alpha, l.rslora ? "lora_alpha / sqrt(r)" : "lora_alpha / r", l.scale(),
          kMaxLoraScale);
    if (!(l.dropout >= 0 && l.dropout < 1))
      fail("{}lora_dropout: must be in [0, 1), got {}", prefix, l.dropout);
    if (l.target_modules.empty()) fail("{}target_modules: names no module to adapt", prefix);
    if (l.train_router && !c.is_moe())
      fail("{}train_router: the model has no Mixture-of-Experts router (model.num_experts = 0)",
           prefix);
  }
  if (c.bottleneck.enabled()) {
    check_limit("", prefix + "adapter_dim", c.bottleneck.dim, limits::kHidden, "channels");
    if (c.bottleneck.target_modules.empty())
      fail("{}target_modules: names no module to adapt", prefix);
  }
  if (c.prompt.enabled()) {
    if (c.prompt.virtual_tokens >= c.max_seq_len)
      fail("{}num_virtual_tokens: {} leaves no room for text in model.max_seq_len = {}", prefix,
           c.prompt.virtual_tokens, c.max_seq_len);
    if (c.prompt.encoder_hidden < 0)
      fail("{}encoder_hidden_size: must be >= 0, got {}", prefix, c.prompt.encoder_hidden);
    if (c.prompt.encoder_hidden > 0)
      check_limit("", prefix + "encoder_hidden_size", c.prompt.encoder_hidden, limits::kHidden,
                  "channels");
  }
  lora_targets(c);  // each target matches
  ia3_targets(c);
  bottleneck_targets(c);
}

namespace {

// The rows [col0, col0 + rows) of `base`'s fused parts, as parts of their
// own (row0 from 0): a whole fused layer's, or none for one part.
std::vector<std::pair<std::string, int64_t>> parts_within(const ParamInfo& base,
                                                          const AdaptedModule& t) {
  std::vector<std::pair<std::string, int64_t>> out;
  if (!t.part.empty()) return out;
  for (const ParamPart& q : base.parts) out.emplace_back(q.name, q.rows);
  return out;
}

// Under tensor parallelism an adapter is split as its layer is (Megatron's
// LoRA layout; a MoE layer's experts' each as its expert's weight, in
// add_adapter_params): over a column-parallel layer (base split by rows: each rank
// some output features, the whole input) A [r, in] is whole on every rank
// and B [rows, r] holds the rank's rows of each fused part, as the layer's
// weight does; over a row-parallel one (split by columns: some input
// features) A holds the rank's columns and B is whole. The whole factor's
// gradient is then each rank's part of it, added over the group
// (Transformer::tensor_parallel_partial_grads).
std::pair<ParamOptions, ParamOptions> lora_split(const ParamInfo& base, const AdaptedModule& t) {
  ParamOptions a, b;
  a.adapter = b.adapter = true;
  if (base.split == Split::Rows) {
    b.split = Split::Rows;
    b.parts = parts_within(base, t);
  } else if (base.split == Split::Cols) {
    a.split = Split::Cols;
  }
  return {a, b};
}

// An IA3 vector as its layer splits what it scales: the output parts of a
// column-parallel layer (its rows of each), the input of a row-parallel one
// (its columns); whole otherwise.
ParamOptions ia3_split(const ParamInfo& base, const AdaptedModule& t) {
  ParamOptions o;
  o.adapter = true;
  if (t.feedforward ? base.split == Split::Cols : base.split == Split::Rows) {
    o.split = Split::Rows;
    if (!t.feedforward) o.parts = parts_within(base, t);
  }
  return o;
}

}  // namespace

void add_adapter_params(ParamLayout& p, const ModelConfig& c) {
  ParamOptions adapter;
  adapter.adapter = true;
  const int64_t r = c.lora.rank;
  // A MoE layer's experts' A and B: one tensor each per layer's linear, a
  // part per expert module (expert-major, as the targets come), added where
  // its first target comes.
  std::map<std::string, std::pair<ParamOptions, ParamOptions>> experts;
  for (const AdaptedModule& t : lora_targets(c)) {
    if (t.lora_part().empty()) continue;
    auto& [a, b] = experts[t.linear];
    a.parts.emplace_back(t.part, r);
    b.parts.emplace_back(t.part, t.rows);
  }
  for (const AdaptedModule& t : lora_targets(c)) {
    const float a_std = float(1.0 / std::sqrt(double(t.in)));
    if (t.lora_part().empty()) {
      const auto [a, b] = lora_split(p.find(t.linear + ".weight"), t);
      p.add(t.a_name(), {r, t.in}, Init::Uniform, a_std, a);
      p.add(t.b_name(), {t.rows, r}, Init::Zeros, 0.f, b);
      continue;
    }
    if (p.has(t.a_name())) continue;
    auto [a, b] = experts.at(t.linear);
    a.adapter = b.adapter = true;
    a.split = b.split = Split::Experts;
    // Each expert's A and B split over the (expert) tensor-parallel group as
    // its weight is, by lora_split's rule: B by rows of each part over the
    // experts' gate | up, A by columns over their down.
    const Split each = p.find(t.linear + ".weight").expert_split;
    if (each == Split::Rows) b.expert_split = Split::Rows;
    if (each == Split::Cols) a.expert_split = Split::Cols;
    int64_t rows = 0;
    for (const auto& part : b.parts) rows += part.second;
    p.add(t.a_name(), {r * int64_t(a.parts.size()), t.in}, Init::Uniform, a_std, a);
    p.add(t.b_name(), {rows, r}, Init::Zeros, 0.f, b);
  }
  for (const AdaptedModule& t : ia3_targets(c))
    p.add(t.ia3_name(), {t.feedforward ? t.in : t.rows}, Init::Ones, 0.f,
          ia3_split(p.find(t.linear + ".weight"), t));
  const int64_t dim = c.bottleneck.dim;
  for (const AdaptedModule& t : bottleneck_targets(c)) {
    p.add(t.adapter_name("ln.weight"), {t.out}, Init::Ones, 0.f, adapter);
    p.add(t.adapter_name("ln.bias"), {t.out}, Init::Zeros, 0.f, adapter);
    // Xavier-normal: std sqrt(2 / (fan_in + fan_out)).
    p.add(t.adapter_name("linear_in.weight"), {dim, t.out}, Init::Normal,
          float(std::sqrt(2.0 / double(dim + t.out))), adapter);
    p.add(t.adapter_name("linear_out.weight"), {t.out, dim}, Init::Zeros, 0.f, adapter);
  }
  if (c.prompt.enabled()) {
    const int64_t C = c.d_model, H = c.prompt.encoder_hidden;
    p.add(kPromptTable, {c.prompt.virtual_tokens, C}, Init::Normal, 1.f, adapter);
    if (H > 0) {
      const std::vector<std::string> layers = prompt_encoder_layers();
      const int64_t shapes[3][2] = {{H, C}, {H, H}, {C, H}};
      for (int i = 0; i < 3; ++i) {
        const float bound = float(1.0 / std::sqrt(double(shapes[i][1])));
        p.add(layers[size_t(i)] + ".weight", {shapes[i][0], shapes[i][1]}, Init::Uniform, bound,
              adapter);
        p.add(layers[size_t(i)] + ".bias", {shapes[i][0]}, Init::Uniform, bound, adapter);
      }
    }
  }
}

namespace {

std::vector<float> host_values(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  ops::copy_to_host(t, v.data());
  return v;
}

// W[part] += s * B A: the product as a linear layer, B [rows, r] times
// (A^T) [in, r] transposed.
void merge_lora_part(const AdaptedModule& t, const Tensor& a, const Tensor& b, float s,
                     Tensor w_part) {
  const int64_t r = a.dim(0);
  std::vector<float> av = host_values(a), trans(av.size());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < t.in; ++j) trans[size_t(j * r + i)] = av[size_t(i * t.in + j)];
  Tensor at = Tensor::empty({t.in, r}, DType::F32);
  ops::copy_from_host(at, trans.data());
  Tensor ba = Tensor::empty({t.rows, t.in}, DType::F32);
  ops::linear_forward(ba, b, at, Tensor());
  ops::scale(ba, s);
  ops::accumulate(w_part, ba);
}

}  // namespace

std::unique_ptr<Transformer> merge_adapters(const Transformer& model) {
  const ModelConfig& c = model.config();
  NK_CHECK(model.device() == kHost, "merge_adapters: the model must be in host memory");
  if (c.bottleneck.enabled() || c.prompt.enabled())
    fail(
        "{} do not fold into the base weights (only LoRA and IA3 merge); use the adapter "
        "unmerged (nekton generate ... generate.adapter=DIR)",
        c.bottleneck.enabled() ? "bottleneck adapters (a nonlinear branch)"
                               : "p-tuning's virtual tokens (inputs, not weights)");
  ModelConfig base = c;
  base.lora = LoraConfig();
  base.ia3 = Ia3Config();
  auto out = std::make_unique<Transformer>(base, model.compute_dtype(), 0, ParamInit::Zeros);
  Tensor dst = out->params();
  // Whatever holds the base (f32 masters, its bf16 copy alone, NF4), in f32.
  for (const ParamInfo& p : out->layout().params())
    ops::convert(ParamLayout::view(dst, p), model.param_f32(model.layout().find(p.name)));
  auto view = [&](const std::string& name, const std::string& part = "") {
    return lora_rows(model.layout().find(name), model.param_f32(model.layout().find(name)), part);
  };
  auto rows_of = [&](const AdaptedModule& t, const char* what) {
    const ParamInfo& w = out->layout().find(t.linear + "." + what);
    return t.part.empty() ? ParamLayout::view(dst, w) : ParamLayout::part_view(dst, w, t.part);
  };
  for (const AdaptedModule& t : lora_targets(c))
    merge_lora_part(t, view(t.a_name(), t.lora_part()), view(t.b_name(), t.lora_part()),
                    float(c.lora.scale()), rows_of(t, "weight"));
  for (const AdaptedModule& t : ia3_targets(c)) {
    const Tensor l = view(t.ia3_name());
    if (t.feedforward) {  // every column of W times its input's scale
      Tensor w = ParamLayout::view(dst, out->layout().find(t.linear + ".weight"));
      ops::scale_columns(w, l, 0);
      continue;
    }
    // rows of W (and b) times the output's scale
    Tensor w = rows_of(t, "weight");
    std::vector<float> wv = host_values(w), lv = host_values(l);
    for (int64_t i = 0; i < t.rows; ++i)
      for (int64_t j = 0; j < t.in; ++j) wv[size_t(i * t.in + j)] *= lv[size_t(i)];
    ops::copy_from_host(w, wv.data());
    if (out->layout().has(t.linear + ".bias")) {
      Tensor b = rows_of(t, "bias").view({1, t.rows});
      ops::scale_columns(b, l, 0);
    }
  }
  // Finite adapters can still overflow when folded in: a merged model with
  // NaN or Inf is never handed on.
  for (const ParamInfo& p : out->layout().params())
    if (const int64_t bad = ops::count_nonfinite(ParamLayout::view(dst, p)); bad > 0)
      fail("merging the adapters left {} non-finite values (NaN or Inf) in '{}'", bad, p.name);
  out->sync_compute_params();
  return out;
}

}  // namespace nk
