#include "model/lora.h"

#include <algorithm>
#include <cmath>

#include "core/limits.h"
#include "model/arch.h"
#include "model/transformer.h"

namespace nk {

namespace {

// Megatron's name of a Nekton linear layer ("" for none of the four).
std::string megatron_name(const std::string& linear) {
  const char* names[] = {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"};
  const int slot = lora_linear_slot(linear);
  return slot < 0 ? "" : names[slot];
}

bool matches(const std::string& target, const LoraTarget& t) {
  return target == "all-linear" || target == t.module || t.module.ends_with("." + target) ||
         target == megatron_name(t.linear);
}

// Every linear layer of the blocks an adapter could go on, one entry per
// Hugging Face module (a fused part or a whole layer), in checkpoint order.
std::vector<LoraTarget> adaptable_modules(const ModelConfig& c) {
  const Architecture& arch = c.architecture();
  ParamLayout base;
  arch.add_params(base, c);
  std::vector<LoraTarget> out;
  for (const ExternalTensor& e : arch.hf_tensors(c, arch.hf_tensor_prefix())) {
    if (!e.param.starts_with("h.") || !e.param.ends_with(".weight") || !e.name.ends_with(".weight"))
      continue;
    const ParamInfo& p = base.find(e.param);
    if (p.shape.size() != 2 || megatron_name(e.param.substr(0, e.param.size() - 7)).empty())
      continue;
    LoraTarget t;
    t.linear = e.param.substr(0, e.param.size() - 7);
    t.part = e.part;
    t.module = e.name.substr(0, e.name.size() - 7);
    t.in = p.shape[1];
    t.col0 = e.part.empty() ? 0 : p.part(e.part).row0;
    t.rows = e.part.empty() ? p.shape[0] : p.part(e.part).rows;
    out.push_back(t);
  }
  return out;
}

}  // namespace

double LoraConfig::scale() const {
  return rslora ? alpha / std::sqrt(double(rank)) : alpha / double(rank);
}

std::string LoraTarget::a_name() const {
  return linear + ".lora_a" + (part.empty() ? "" : "." + part);
}

std::string LoraTarget::b_name() const {
  return linear + ".lora_b" + (part.empty() ? "" : "." + part);
}

std::vector<LoraTarget> lora_targets(const ModelConfig& c) {
  if (!c.lora.enabled()) return {};
  const std::vector<LoraTarget> all = adaptable_modules(c);
  std::vector<bool> chosen(all.size(), false);
  for (const std::string& target : c.lora.target_modules) {
    bool any = false;
    for (size_t i = 0; i < all.size(); ++i)
      if (matches(target, all[i])) chosen[i] = any = true;
    if (any) continue;
    std::vector<std::string> names;  // the short names of layer 0's modules
    for (const LoraTarget& t : all)
      if (t.linear.starts_with("h.0.")) names.push_back(t.module.substr(t.module.rfind('.') + 1));
    fail(
        "peft.target_modules: '{}' matches no linear layer of this {} model (its modules: {}; "
        "Megatron's names: linear_qkv, linear_proj, linear_fc1, linear_fc2; or all-linear)",
        target, c.architecture().display_name(), fmt::join(names, ", "));
  }
  std::vector<LoraTarget> out;
  for (size_t i = 0; i < all.size(); ++i)
    if (chosen[i]) out.push_back(all[i]);
  return out;
}

int lora_linear_slot(const std::string& linear) {
  const char* suffixes[] = {".attn.qkv", ".attn.proj", ".mlp.up", ".mlp.down"};
  for (int i = 0; i < 4; ++i)
    if (linear.ends_with(suffixes[i])) return i;
  return -1;
}

LoraSizes lora_sizes(const ModelConfig& c) {
  LoraSizes s;
  if (!c.lora.enabled()) return s;
  s.rank = c.lora.rank;
  s.parts.assign(size_t(c.n_layer), {0, 0, 0, 0});
  for (const LoraTarget& t : lora_targets(c)) {
    const int64_t layer = std::stoll(t.linear.substr(2, t.linear.find('.', 2) - 2));
    s.parts[size_t(layer)][size_t(lora_linear_slot(t.linear))] += 1;
    s.max_rows = std::max(s.max_rows, t.rows);
    s.max_in = std::max(s.max_in, t.in);
  }
  return s;
}

void validate_lora(const ModelConfig& c, const std::string& prefix) {
  const LoraConfig& l = c.lora;
  if (!l.enabled()) return;
  check_limit("", prefix + "lora_rank", l.rank, limits::kHidden, "ranks");
  if (!(l.alpha > 0) || !std::isfinite(l.alpha))
    fail("{}lora_alpha: must be a positive number, got {}", prefix, l.alpha);
  if (!(l.dropout >= 0 && l.dropout < 1))
    fail("{}lora_dropout: must be in [0, 1), got {}", prefix, l.dropout);
  if (l.target_modules.empty()) fail("{}target_modules: names no module to adapt", prefix);
  lora_targets(c);  // each target matches
}

void add_lora_params(ParamLayout& p, const ModelConfig& c) {
  const int64_t r = c.lora.rank;
  for (const LoraTarget& t : lora_targets(c)) {
    ParamOptions adapter;
    adapter.adapter = true;
    p.add(t.a_name(), {r, t.in}, Init::Uniform, float(1.0 / std::sqrt(double(t.in))), adapter);
    p.add(t.b_name(), {t.rows, r}, Init::Zeros, 0.f, adapter);
  }
}

std::unique_ptr<Transformer> merge_lora(const Transformer& model) {
  const ModelConfig& c = model.config();
  NK_CHECK(model.device() == kHost, "merge_lora: the model must be in host memory");
  ModelConfig base = c;
  base.lora = LoraConfig();
  auto out = std::make_unique<Transformer>(base, model.compute_dtype(), 0, ParamInit::Zeros);
  Tensor src = const_cast<Transformer&>(model).params(), dst = out->params();
  for (const ParamInfo& p : out->layout().params())
    ops::convert(ParamLayout::view(dst, p), ParamLayout::view(src, model.layout().find(p.name)));
  const float s = float(c.lora.scale());
  for (const LoraTarget& t : lora_targets(c)) {
    // W[part] += s * B A: the product as a linear layer, B [rows, r] times
    // (A^T) [in, r] transposed.
    const Tensor a = ParamLayout::view(src, model.layout().find(t.a_name()));
    const Tensor b = ParamLayout::view(src, model.layout().find(t.b_name()));
    Tensor at = Tensor::empty({t.in, c.lora.rank}, DType::F32);
    std::vector<float> host(size_t(a.numel())), trans(host.size());
    ops::copy_to_host(a, host.data());
    for (int64_t i = 0; i < c.lora.rank; ++i)
      for (int64_t j = 0; j < t.in; ++j)
        trans[size_t(j * c.lora.rank + i)] = host[size_t(i * t.in + j)];
    ops::copy_from_host(at, trans.data());
    Tensor ba = Tensor::empty({t.rows, t.in}, DType::F32);
    ops::linear_forward(ba, b, at, Tensor());
    ops::scale(ba, s);
    const ParamInfo& w = out->layout().find(t.linear + ".weight");
    ops::accumulate(
        t.part.empty() ? ParamLayout::view(dst, w) : ParamLayout::part_view(dst, w, t.part), ba);
  }
  out->sync_compute_params();
  return out;
}

}  // namespace nk
