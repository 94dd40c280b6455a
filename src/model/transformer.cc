#include "model/transformer.h"

#include <cmath>
#include <map>
#include <optional>

#include "core/rng.h"
#include "model/arch.h"
#include "model/rope.h"

namespace nk {

namespace {

std::string L(int64_t l, const char* name) {
  return fmt::format("h.{}.{}", l, name);
}

// Zeroed storage for p's runs (zeros read back as zeros in every format).
// nk::Error naming p when the runs do not cover its rows in whole fused parts.
std::vector<ops::QuantWeight> quant_storage(const ParamInfo& p, const std::vector<QuantRun>& runs,
                                            Device device) {
  if (p.shape.size() != 2) fail("quantised parameter '{}' is not a matrix", p.name);
  std::vector<ops::QuantWeight> out;
  int64_t row = 0;
  for (const QuantRun& r : runs) {
    bool at_part = p.parts.empty() ? row == 0 : false;
    for (const ParamPart& part : p.parts) at_part |= part.row0 == row;
    if (!at_part || r.rows <= 0)
      fail("quantised parameter '{}': a run of {} rows at row {} does not start a fused part",
           p.name, r.rows, row);
    ops::QuantWeight q = ops::QuantWeight::empty(r.type, {r.rows, p.shape[1]}, device);
    q.data = Tensor::zeros(q.data.shape(), q.data.dtype(), device);
    if (q.scale.defined()) q.scale = Tensor::zeros(q.scale.shape(), q.scale.dtype(), device);
    out.push_back(q);
    row += r.rows;
  }
  if (row != p.shape[0])
    fail("quantised parameter '{}': runs cover {} of its {} rows", p.name, row, p.shape[0]);
  return out;
}

}  // namespace

bool PipelineStage::holds(const ModelConfig& cfg, const std::string& name) const {
  if (name == "wte") return embedding || (head && cfg.tied_embeddings);
  if (name == "wpe") return embedding;
  if (name.starts_with("ln_f.") || name.starts_with("lm_head.")) return head;
  if (name.starts_with("h.")) {
    return holds_layer(cfg, std::stoll(name.substr(2, name.find('.', 2) - 2)));
  }
  return true;  // adapters' and the prompt's: only with the whole model
}

void check_tensor_parallel(const ModelConfig& cfg, int64_t tp) {
  if (tp < 1) fail("parallel.tp = {} must be at least 1", tp);
  if (tp == 1) return;
  const std::pair<const char*, int64_t> split[] = {{"model.n_head", cfg.n_head},
                                                   {"model.n_kv_head", cfg.n_kv_head},
                                                   {"model.d_ff", cfg.d_ff},
                                                   {"model.vocab_size", cfg.vocab_size}};
  for (const auto& [key, value] : split) {
    if (value % tp == 0) continue;
    if (std::string(key) == "model.vocab_size")
      fail(
          "model.vocab_size = {} is not divisible by parallel.tp = {} (the vocabulary is split "
          "over the tensor-parallel ranks): pad it, e.g. model.vocab_size={}",
          value, tp, (value + 128 * tp - 1) / (128 * tp) * (128 * tp));
    fail("{} = {} is not divisible by parallel.tp = {} (split over the tensor-parallel ranks)", key,
         value, tp);
  }
}

ParamLayout Transformer::layout_for(const ModelConfig& cfg, const std::vector<std::string>& frozen,
                                    FrozenWeights frozen_weights, const QuantPlan& quant) {
  NK_CHECK(quant.empty() || frozen_weights == FrozenWeights::Quantized,
           "a QuantPlan without FrozenWeights::Quantized");
  if (frozen_weights == FrozenWeights::Quantized) {
    std::vector<std::string> names;
    for (const auto& [name, runs] : quant) names.push_back(name);
    return model_layout(cfg, frozen, names);
  }
  ParamLayout layout = model_layout(cfg, frozen);
  if (frozen_weights != FrozenWeights::Nf4) return layout;
  // QLoRA's base: every frozen weight matrix but learned positions.
  std::vector<std::string> quantized;
  for (const ParamInfo& p : layout.params())
    if (!p.trainable && !p.adapter && p.shape.size() == 2 && p.name != "wpe")
      quantized.push_back(p.name);
  return model_layout(cfg, frozen, quantized);
}

Transformer::Transformer(const ModelConfig& cfg, DType compute, uint64_t seed, ParamInit init,
                         const std::vector<std::string>& frozen, Device device,
                         FrozenWeights frozen_weights, const QuantPlan& quant,
                         nn::TensorParallel tp, PipelineStage stage)
    : cfg_(cfg),
      compute_(compute),
      device_(device),
      frozen_weights_(frozen_weights),
      tp_(tp),
      stage_(stage),
      global_layout_(layout_for(cfg, frozen, frozen_weights, quant)) {
  // model_layout validated cfg (bounded shapes) before sizing anything.
  NK_CHECK(compute == DType::F32 || compute == DType::BF16, "compute dtype {}",
           dtype_name(compute));
  check_tensor_parallel(cfg_, tp_.size());
  const bool whole = stage_.whole(cfg_);
  for (const auto& [first, last] : stage_.ranges(cfg_))
    NK_CHECK(0 <= first && first <= last && last <= cfg_.n_layer,
             "pipeline stage: layers [{}, {}) of {}", first, last, cfg_.n_layer);
  if ((tp_.active() || !whole) && (frozen_weights != FrozenWeights::Master || cfg_.has_adapters()))
    fail(
        "tensor and pipeline parallelism need a model without adapters, its frozen weights held "
        "as masters");
  layout_ =
      whole ? global_layout_
            : global_layout_.subset([&](const ParamInfo& p) { return stage_.holds(cfg_, p.name); });
  if (tp_.active()) layout_ = layout_.shard(tp_.size());
  // f32 masters: every parameter, or only the trainable ones (in f32 compute
  // the frozen dense ones too: their compute copy is the master).
  const int64_t masters = frozen_weights == FrozenWeights::Master ? layout_.total()
                          : compute == DType::F32                 ? layout_.dense_end()
                                                                  : layout_.trainable_end();
  params_ = Tensor::empty({masters}, DType::F32, device_);
  grads_ = Tensor::empty({layout_.trainable_end()}, DType::F32, device_);
  ops::fill(params_, 0.f);
  zero_grads();
  compute_params_ =
      compute == DType::F32 ? params_ : Tensor::empty({layout_.dense_end()}, compute, device_);
  if (compute_params_.raw() != params_.raw()) ops::fill(compute_params_, 0.f);
  for (const ParamInfo& p : layout_.params()) {
    if (!p.quantized) continue;
    if (frozen_weights == FrozenWeights::Quantized) {
      quant_[p.name] = quant_storage(p, quant.at(p.name), device_);
      continue;
    }
    // All-zero storage reads back as zeros (scale and offset 0) until set.
    ops::Nf4Weight q = ops::Nf4Weight::empty(p.shape, device_);
    for (Tensor* t : {&q.codes, &q.absmax_codes, &q.absmax_scale, &q.absmax_offset})
      *t = Tensor::zeros(t->shape(), t->dtype(), device_);
    nf4_[p.name] = q;
  }
  // Each parameter draws from its own stream so that adding a parameter does
  // not change the others' initial values. A tensor-parallel rank draws the
  // whole parameter and keeps its shard.
  std::vector<float> host, whole_value;
  for (size_t i = 0; init != ParamInit::Zeros && i < global_layout_.params().size(); ++i) {
    const ParamInfo& g = global_layout_.params()[i];
    if (!layout_.has(g.name)) continue;  // another pipeline stage's
    const ParamInfo& p = layout_.find(g.name);
    if (init == ParamInit::Adapters && !p.adapter) continue;
    whole_value.assign(size_t(g.numel()), g.init == Init::Ones ? 1.f : 0.f);
    Rng rng(seed * 1000003ull + i);
    if (g.init == Init::Normal)
      for (auto& v : whole_value) v = float(rng.normal() * g.init_std);
    if (g.init == Init::Uniform)
      for (auto& v : whole_value) v = float((2 * rng.uniform() - 1) * g.init_std);
    if (tp_.active()) {
      host.resize(size_t(p.numel()));
      extract_shard(g, tp_.rank(), tp_.size(), sizeof(float), whole_value.data(), host.data());
    } else {
      host.swap(whole_value);
    }
    if (has_master(p))
      ops::copy_from_host(ParamLayout::view(params_, p), host.data());
    else if (device_ == kHost)  // no second f32 copy of (say) a 1 GiB embedding table
      set_param(p, Tensor::from_blob(host.data(), p.shape, DType::F32));
    else
      set_param(p, ops::to_device(Tensor::from_blob(host.data(), p.shape, DType::F32), device_));
  }
  sync_compute_params();
  const BlockSpec spec = cfg_.architecture().block();
  // One table for training and the KV-cache path; scaled as the config says (model/rope.h).
  if (!spec.learned_positions)
    rope_ = ops::to_device(rope_table(cfg_.max_seq_len, cfg_.head_dim(), cfg_.rope_theta,
                                      cfg_.rope_scaling, cfg_.max_seq_len),
                           device_);
  bind_views();
}

void Transformer::sync_compute_params() {
  if (compute_params_.raw() != params_.raw())
    ops::convert(compute_params_.narrow0(0, params_.numel()), params_);
}

void Transformer::release_masters() {
  NK_CHECK(compute_ == DType::BF16, "release_masters: a {} model's masters are its weights",
           dtype_name(compute_));
  params_ = Tensor::empty({0}, DType::F32, device_);
}

void Transformer::adopt_masters(Tensor masters) {
  NK_CHECK(compute_ == DType::BF16 && masters.dtype() == DType::F32 && masters.ndim() == 1 &&
               masters.is_contiguous() && masters.numel() <= layout_.dense_end() &&
               masters.device() == device_,
           "adopt_masters: {} for a {} model of {} dense elements", masters.desc(),
           dtype_name(compute_), layout_.dense_end());
  params_ = std::move(masters);
}

Tensor Transformer::param_f32(const ParamInfo& p) const {
  if (has_master(p)) return ParamLayout::view(params_, p);
  Tensor out = Tensor::empty(p.shape, DType::F32, device_);
  if (p.quantized && quant_.count(p.name)) {
    int64_t row = 0;
    for (const ops::QuantWeight& q : quant_.at(p.name)) {
      ops::quant_dequantize(out.narrow0(row, q.rows()), q);
      row += q.rows();
    }
  } else if (p.quantized) {
    ops::nf4_dequantize(out, nf4_.at(p.name));
  } else {
    ops::convert(out, ParamLayout::view(compute_params_, p));
  }
  return out;
}

void Transformer::set_param(const ParamInfo& p, const Tensor& src) {
  check_shape(src, p.shape, p.name.c_str());
  if (p.quantized) {
    Tensor f = src;
    if (src.dtype() != DType::F32) {
      f = Tensor::empty(p.shape, DType::F32, device_);
      ops::convert(f, src);
    }
    if (auto it = quant_.find(p.name); it != quant_.end()) {
      int64_t row = 0;
      for (ops::QuantWeight& q : it->second) {
        ops::quant_quantize(q, f.narrow0(row, q.rows()));
        row += q.rows();
      }
      return;
    }
    ops::nf4_quantize(nf4_.at(p.name), f);
    return;
  }
  if (has_master(p)) ops::convert(ParamLayout::view(params_, p), src);
  if (compute_params_.raw() != params_.raw() || !has_master(p))
    ops::convert(ParamLayout::view(compute_params_, p),
                 has_master(p) ? ParamLayout::view(params_, p) : src);
}

Tensor Transformer::prompt_f32() const {
  NK_CHECK(prompt_.active(), "prompt_f32: the model has no p-tuning prompt");
  const PromptConfig& pc = cfg_.prompt;
  nn::Prompt::Saved s =
      nn::Prompt::saved_for(pc.virtual_tokens, cfg_.d_model, pc.encoder_hidden, compute_, device_);
  const Tensor p = prompt_.forward(s);
  Tensor f = Tensor::empty(p.shape(), DType::F32, device_);
  ops::convert(f, p);
  if (device_ == kHost) return f;
  Tensor out = Tensor::empty(p.shape(), DType::F32);
  ops::copy_to_host(f, out.data<float>());
  return out;
}

size_t Transformer::weight_bytes() const {
  size_t n = params_.nbytes();
  if (compute_params_.raw() != params_.raw()) n += compute_params_.nbytes();
  for (const auto& [name, q] : nf4_) n += q.nbytes();
  for (const auto& [name, runs] : quant_)
    for (const ops::QuantWeight& q : runs) n += q.nbytes();
  return n;
}

void Transformer::zero_grads() {
  ops::fill(grads_, 0.f);
  if (grad_stage_.defined()) ops::fill(grad_stage_, 0.f);
}

int64_t GradStaging::unit_of(const ModelConfig& cfg, const std::string& name) {
  if (name.starts_with("h.")) return std::stoll(name.substr(2, name.find('.', 2) - 2));
  if (name.starts_with("ln_f.") || name.starts_with("lm_head.")) return cfg.n_layer;
  return cfg.n_layer + 1;  // wte, wpe, the prompt
}

GradStaging plan_grad_staging(const ModelConfig& cfg, const ParamLayout& layout) {
  GradStaging g;
  g.units.resize(size_t(cfg.n_layer + 2));
  std::vector<int64_t> size(g.units.size(), 0);
  auto add = [&](const ParamInfo& p, int64_t unit) {
    g.units[size_t(unit)].push_back({p.offset, size[size_t(unit)], p.numel(), p.name});
    size[size_t(unit)] += p.numel();
  };
  for (const ParamInfo& p : layout.params()) {
    if (!p.trainable) continue;
    add(p, GradStaging::unit_of(cfg, p.name));
    if (p.name == "wte" && cfg.tied_embeddings) add(p, cfg.n_layer);  // the tied head's use
  }
  g.elems = *std::max_element(size.begin(), size.end());
  return g;
}

void Transformer::set_grad_dtype(DType dtype) {
  NK_CHECK(dtype == DType::F32 || dtype == DType::BF16, "gradients in {}", dtype_name(dtype));
  staging_ = GradStaging();
  grad_stage_ = Tensor();
  if (dtype == DType::BF16) {
    if (tp_.active() || !stage_.whole(cfg_))
      fail("optim.grad_dtype=bf16: tensor and pipeline parallel layouts are not supported yet");
    staging_ = plan_grad_staging(cfg_, layout_);
    grad_stage_ = Tensor::empty({staging_.elems}, DType::F32, device_);
  }
  grads_ = Tensor::empty({layout_.trainable_end()}, dtype, device_);
  zero_grads();
  bind_views();
}

Tensor Transformer::grad_view(const ParamInfo& p, int64_t unit) const {
  if (!grad_stage_.defined()) return ParamLayout::view(grads_, p);
  for (const GradStaging::Span& s : staging_.units[size_t(unit)])
    if (s.name == p.name) return grad_stage_.narrow0(s.stage, s.n).view(p.shape);
  NK_CHECK(false, "grad_view: '{}' has no gradient in backward stage {}", p.name, unit);
  return Tensor();
}

void Transformer::flush_grads(int64_t unit) {
  if (!grad_stage_.defined()) return;
  int64_t used = 0;
  for (const GradStaging::Span& s : staging_.units[size_t(unit)]) {
    ops::accumulate(grads_.narrow0(s.grad, s.n), grad_stage_.narrow0(s.stage, s.n));
    used = std::max(used, s.stage + s.n);
  }
  if (used > 0) ops::fill(grad_stage_.narrow0(0, used), 0.f);
}

void Transformer::bind_views() {
  const BlockSpec spec = cfg_.architecture().block();
  auto w = [&](const std::string& n) {
    const ParamInfo& p = layout_.find(n);
    return p.quantized ? Tensor() : ParamLayout::view(compute_params_, p);
  };
  auto q = [&](const std::string& n) {
    auto it = nf4_.find(n);
    return it == nf4_.end() ? ops::Nf4Weight() : it->second;
  };
  auto runs = [&](const std::string& n) {
    auto it = quant_.find(n);
    return it == quant_.end() ? std::vector<ops::QuantWeight>() : it->second;
  };
  auto g = [&](const std::string& n) {
    const ParamInfo& p = layout_.find(n);
    return p.trainable ? grad_view(p, GradStaging::unit_of(cfg_, n)) : Tensor();
  };
  auto maybe = [&](const std::string& n, bool grad) {
    if (!layout_.has(n)) return Tensor();
    return grad ? g(n) : w(n);
  };
  auto linear = [&](const std::string& base) {
    nn::Linear lin;
    lin.w = w(base + ".weight");
    lin.wq = q(base + ".weight");
    lin.wquant = runs(base + ".weight");
    lin.dw = g(base + ".weight");
    lin.b = maybe(base + ".bias", false);
    lin.db = maybe(base + ".bias", true);
    return lin;
  };
  auto norm = [&](const std::string& base) {
    nn::Norm n;
    n.rms = spec.rms_norm;
    n.eps = float(cfg_.norm_eps);
    n.w = w(base + ".weight");
    n.dw = g(base + ".weight");
    n.b = maybe(base + ".bias", false);
    n.db = maybe(base + ".bias", true);
    return n;
  };
  // Adapters (model/peft.h): each LoRA target's A and B, each IA3 scale, on its layer.
  std::map<std::string, nn::Lora> loras;
  for (const AdaptedModule& t : lora_targets(cfg_)) {
    nn::Lora& lo = loras[t.linear];
    lo.rank = cfg_.lora.rank;
    lo.scale = float(cfg_.lora.scale());
    lo.dropout = float(cfg_.lora.dropout);
    lo.id = loras.size();
    lo.parts.push_back({w(t.a_name()), w(t.b_name()), g(t.a_name()), g(t.b_name()), t.col0});
  }
  std::map<std::string, nn::Ia3> ia3s;
  for (const AdaptedModule& t : ia3_targets(cfg_)) {
    nn::Ia3& s = ia3s[t.linear];
    if (t.feedforward) {
      s.in = w(t.ia3_name());
      s.din = g(t.ia3_name());
    } else {
      s.out.push_back({w(t.ia3_name()), g(t.ia3_name()), t.col0});
    }
  }
  std::map<std::string, nn::Bottleneck> bottlenecks;
  for (const AdaptedModule& t : bottleneck_targets(cfg_)) {
    nn::Bottleneck& a = bottlenecks[t.linear];
    a.ln_w = w(t.adapter_name("ln.weight"));
    a.ln_b = w(t.adapter_name("ln.bias"));
    a.w_in = w(t.adapter_name("linear_in.weight"));
    a.w_out = w(t.adapter_name("linear_out.weight"));
    a.dln_w = g(t.adapter_name("ln.weight"));
    a.dln_b = g(t.adapter_name("ln.bias"));
    a.dw_in = g(t.adapter_name("linear_in.weight"));
    a.dw_out = g(t.adapter_name("linear_out.weight"));
    a.eps = float(kBottleneckNormEps);
  }
  auto adapted = [&](const std::string& base) {
    nn::Linear lin = linear(base);
    if (auto it = loras.find(base); it != loras.end()) lin.lora = it->second;
    if (auto it = ia3s.find(base); it != ia3s.end()) lin.ia3 = it->second;
    if (auto it = bottlenecks.find(base); it != bottlenecks.end()) lin.bottleneck = it->second;
    return lin;
  };
  // Tensor parallel: this rank's heads, MLP units and vocabulary rows; a
  // row-parallel layer's bias is added once, by tp rank 0, before the group
  // sums its partial outputs (the other ranks hold it and its gradient).
  const int64_t t = tp_.size();
  auto row_parallel = [&](nn::Linear lin) {
    if (tp_.rank() != 0) lin.b = Tensor();
    return lin;
  };
  embed_ = nn::Embedding();
  embed_.tp = tp_;
  embed_.vocab_start = tp_.rank() * (cfg_.vocab_size / t);
  if (layout_.has("wte")) {  // a pipeline stage without the embedding nor a tied head has none
    embed_.wte = w("wte");
    embed_.wte_q = q("wte");
    if (std::vector<ops::QuantWeight> r = runs("wte"); !r.empty()) embed_.wte_quant = r[0];
    embed_.dwte = g("wte");
  }
  embed_.wpe = maybe("wpe", false);
  embed_.dwpe = maybe("wpe", true);
  blocks_.clear();
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    Block b;
    if (!stage_.holds_layer(cfg_, l)) {  // another pipeline stage's
      blocks_.push_back(b);
      continue;
    }
    b.norm1 = norm(L(l, "ln1"));
    b.norm2 = norm(L(l, "ln2"));
    b.attn.qkv = adapted(L(l, "attn.qkv"));
    b.attn.proj = row_parallel(adapted(L(l, "attn.proj")));
    b.attn.n_head = cfg_.n_head / t;
    b.attn.n_kv_head = cfg_.n_kv_head / t;
    b.attn.tp = tp_;
    b.attn.head_dim = cfg_.head_dim();
    b.attn.window = cfg_.sliding_window;
    b.attn.rope = rope_;
    b.mlp.up = adapted(L(l, "mlp.up"));
    b.mlp.down = row_parallel(adapted(L(l, "mlp.down")));
    b.mlp.swiglu = spec.swiglu;
    b.mlp.tp = tp_;
    blocks_.push_back(b);
  }
  prompt_ = nn::Prompt();
  if (cfg_.prompt.enabled()) {
    prompt_.table = w(kPromptTable);
    prompt_.dtable = g(kPromptTable);
    const std::vector<std::string> mlp = prompt_encoder_layers();
    for (size_t i = 0; i < mlp.size() && cfg_.prompt.encoder_hidden > 0; ++i)
      prompt_.mlp[i] = linear(mlp[i]);
  }
  norm_f_ = nn::Norm();
  head_ = nn::Linear();
  if (stage_.head) norm_f_ = norm("ln_f");
  if (stage_.head && cfg_.tied_embeddings) {
    head_.w = embed_.wte;
    head_.wq = embed_.wte_q;
    if (embed_.wte_quant.defined()) head_.wquant = {embed_.wte_quant};
    if (embed_.dwte.defined()) head_.dw = grad_view(layout_.find("wte"), head_unit());
  } else if (stage_.head) {
    head_ = linear("lm_head");
  }
  loss_.tp = tp_;
  loss_.vocab_start = embed_.vocab_start;
  loss_.ignore_index = kIgnoreIndex;
}

std::vector<Tensor> Transformer::sequence_parallel_grads() const {
  std::vector<Tensor> out;
  if (!tp_.sp()) return out;
  auto add = [&](const nn::Norm& n) {
    for (const Tensor& g : {n.dw, n.db})
      if (g.defined()) out.push_back(g);
  };
  for (const Block& b : blocks_) {  // (another pipeline stage's blocks hold nothing)
    add(b.norm1);
    add(b.norm2);
  }
  add(norm_f_);
  return out;
}

namespace {

// The packed rows' document starts and positions (both undefined without).
std::pair<Tensor, Tensor> packed_tensors(const PackedBatchInfo* packed) {
  if (!packed) return {};
  NK_CHECK(packed->cu_seqlens.defined() && packed->position_ids.defined(),
           "PackedBatchInfo needs both cu_seqlens and position_ids");
  return {packed->cu_seqlens, packed->position_ids};
}

}  // namespace

void Transformer::place_prompt(Tensor x, int64_t B, int64_t T, nn::Prompt::Saved& s) const {
  const int64_t n = prompt_.n();
  if (T < n) fail("a sequence of {} positions is shorter than p-tuning's {} virtual tokens", T, n);
  const Tensor p = prompt_.forward(s);
  for (int64_t b = 0; b < B; ++b) {
    Tensor dst = x.narrow0(b * T, n);
    if (embed_.wpe.defined())
      ops::add(dst, p, embed_.wpe.narrow0(0, n));
    else
      ops::convert(dst, p);
  }
}

void Transformer::embed_forward(Activations& a, const Tensor& tokens,
                                const PackedBatchInfo* packed) {
  check_shape(tokens, {a.B, a.T}, "tokens");
  NK_CHECK(stage_.embedding, "embed_forward: this pipeline stage holds no embedding");
  embed_.forward(a.res[0], tokens, packed_tensors(packed).second, a.full_x);
  // Packed rows: the prompt goes before each row's first document (the
  // trainer gives p-tuning one sample per row).
  if (prompt_.active()) place_prompt(nn::rows(a.res[0]), a.B, a.T, a.prompt);
}

void Transformer::blocks_forward(Activations& a, int64_t first, int64_t last,
                                 const PackedBatchInfo* packed) {
  NK_CHECK(0 <= first && first <= last && last <= cfg_.n_layer,
           "blocks_forward: layers [{}, {}) of {}", first, last, cfg_.n_layer);
  for (int64_t l = first; l < last; ++l)
    NK_CHECK(stage_.holds_layer(cfg_, l), "blocks_forward: layer {} is another pipeline stage's",
             l);
  const auto [cu, pos] = packed_tensors(packed);
  if (a.adapters) a.adapters->seed = dropout_seed_;
  for (int64_t l = first; l < last; ++l) {
    layer_forward(a, l, cu, pos, true);
    if (a.observer_ && a.dres.defined()) a.observer_->forward_done(a, l);
  }
}

void Transformer::layer_forward(Activations& a, int64_t l, const Tensor& cu, const Tensor& pos,
                                bool output) {
  const bool training = a.layers.size() == blocks_.size();
  const Block& b = blocks_[size_t(l)];
  Activations::Layer& y = a.layers[training ? size_t(l) : 0];
  b.norm1.forward(nn::rows(y.ln1), y.mean1, y.rstd1, nn::rows(a.res[l]));
  b.attn.forward(a.tmp, y.attn, y.ln1, cu, pos);
  ops::add(y.res_mid, a.res[l], a.tmp);
  b.norm2.forward(nn::rows(y.ln2), y.mean2, y.rstd2, nn::rows(y.res_mid));
  b.mlp.forward(a.tmp, y.mlp, y.ln2);
  if (output) ops::add(a.res[l + 1], y.res_mid, a.tmp);
}

void Transformer::final_norm_forward(Activations& a) {
  norm_f_.forward(nn::rows(a.lnf), a.meanf, a.rstdf, nn::rows(a.res.back()));
}

void Transformer::forward_body(Activations& a, const Tensor& tokens,
                               const PackedBatchInfo* packed) {
  NK_CHECK(stage_.whole(cfg_), "the whole forward on one pipeline stage");
  embed_forward(a, tokens, packed);
  blocks_forward(a, 0, int64_t(blocks_.size()), packed);
  final_norm_forward(a);
}

// LM head and cross-entropy in row chunks; with backward, also d lnf and the
// head's weight gradient chunk by chunk, then the final norm's backward.
float Transformer::head_loss(Activations& a, const Tensor& targets, bool backward,
                             float grad_scale) {
  check_shape(targets, {a.B, a.T}, "targets");
  NK_CHECK(stage_.head, "head_loss: this pipeline stage holds no head");
  NK_CHECK(!backward || a.dres.defined(), "head_loss: backward needs training activations");
  final_norm_forward(a);
  int64_t N = a.B * a.T;
  int64_t valid = ops::count_not_equal(targets, kIgnoreIndex);
  float row_scale = valid ? grad_scale / float(valid) : 0.f;
  // The head is column-parallel over the vocabulary: every row in, this
  // rank's columns of the logits out.
  Tensor x = nn::rows(tp_.enter(a.lnf, a.full_x));
  Tensor dx = backward ? nn::rows(tp_.enter_grad(a.dln, a.full_y)) : Tensor();
  Tensor tg = targets.view({N});
  for (int64_t r = 0; r < N; r += a.chunk) {
    int64_t n = std::min(a.chunk, N - r);
    Tensor logits = a.logits.narrow0(0, n), xr = x.narrow0(r, n);
    head_.forward(logits, xr);
    loss_.forward(a.losses.narrow0(r, n), logits, tg.narrow0(r, n), backward, row_scale,
                  a.ce_stats);
    if (backward) head_.backward(dx.narrow0(r, n), logits, xr);
  }
  if (backward) tp_.enter_backward(a.dln, a.full_y);
  ops::copy_to_host(a.losses, a.host_losses.data());
  double sum = 0;
  for (float v : a.host_losses) sum += v;
  if (backward) {
    // dres carries d loss / d residual stream from the top down.
    ops::fill(a.dres, 0.f);
    norm_f_.backward(nn::rows(a.dres), nn::rows(a.dln), nn::rows(a.res.back()), a.meanf, a.rstdf);
    flush_grads(head_unit());
  }
  return valid ? float(sum / double(valid)) : 0.f;
}

void Transformer::blocks_backward(Activations& a, int64_t first, int64_t last,
                                  const PackedBatchInfo* packed) {
  NK_CHECK(a.layers.size() == blocks_.size() && a.dres.defined(),
           "blocks_backward needs training activations");
  NK_CHECK(0 <= first && first <= last && last <= cfg_.n_layer,
           "blocks_backward: layers [{}, {}) of {}", first, last, cfg_.n_layer);
  for (int64_t l = first; l < last; ++l)
    NK_CHECK(stage_.holds_layer(cfg_, l), "blocks_backward: layer {} is another pipeline stage's",
             l);
  const auto [cu, pos] = packed_tensors(packed);
  if (a.adapters) a.adapters->seed = dropout_seed_;
  for (int64_t l = last - 1; l >= first; --l) {
    const Block& b = blocks_[size_t(l)];
    Activations::Layer& y = a.layers[size_t(l)];
    if (a.observer_) a.observer_->backward_next(a, l);
    // What the layer's forward dropped, recomputed from what it kept: the
    // same kernels on the same inputs, so the same bits.
    if (a.recompute_of(l) == Recompute::Full) layer_forward(a, l, cu, pos, false);
    if (a.recompute_of(l) == Recompute::Selective) {
      b.norm1.forward(nn::rows(y.ln1), y.mean1, y.rstd1, nn::rows(a.res[l]));
      b.norm2.forward(nn::rows(y.ln2), y.mean2, y.rstd2, nn::rows(y.res_mid));
      b.mlp.activation_forward(y.mlp);
    }
    b.mlp.backward(a.dln, a.dres, y.mlp, a.dmlp, y.ln2);
    b.norm2.backward(nn::rows(a.dres), nn::rows(a.dln), nn::rows(y.res_mid), y.mean2, y.rstd2);
    b.attn.backward(a.dln, a.dres, y.attn, a.dattn, y.ln1, cu, pos);
    b.norm1.backward(nn::rows(a.dres), nn::rows(a.dln), nn::rows(a.res[l]), y.mean1, y.rstd1);
    flush_grads(l);
  }
}

void Transformer::embed_backward(Activations& a, const Tensor& tokens,
                                 const PackedBatchInfo* packed) {
  NK_CHECK(a.dres.defined(), "embed_backward needs training activations");
  NK_CHECK(stage_.embedding, "embed_backward: this pipeline stage holds no embedding");
  if (prompt_.active()) {
    // The virtual positions' gradient, summed over the rows, is the
    // prompt's; their tokens get none.
    const int64_t n = prompt_.n();
    const bool trained = prompt_.dtable.defined();
    Tensor d = nn::rows(a.dres);
    if (trained) ops::fill(a.prompt.dp, 0.f);
    for (int64_t b = 0; b < a.B; ++b) {
      if (trained) ops::accumulate(a.prompt.dp, d.narrow0(b * a.T, n));
      ops::fill(d.narrow0(b * a.T, n), 0.f);
    }
    if (trained) prompt_.backward(a.prompt);
  }
  embed_.backward(a.dres, tokens, packed_tensors(packed).second, a.full_x);
  flush_grads(embed_unit());
}

float Transformer::forward_loss(Activations& a, const Tensor& tokens, const Tensor& targets,
                                const PackedBatchInfo* packed) {
  embed_forward(a, tokens, packed);
  blocks_forward(a, 0, int64_t(blocks_.size()), packed);
  return head_loss(a, targets, false, 0.f);
}

float Transformer::forward_backward(Activations& a, const Tensor& tokens, const Tensor& targets,
                                    float grad_scale, const PackedBatchInfo* packed) {
  NK_CHECK(a.layers.size() == blocks_.size() && a.dres.defined(),
           "forward_backward needs training activations");
  const int64_t L = int64_t(blocks_.size());
  embed_forward(a, tokens, packed);
  blocks_forward(a, 0, L, packed);
  float loss = head_loss(a, targets, true, grad_scale);
  blocks_backward(a, 0, L, packed);
  embed_backward(a, tokens, packed);
  return loss;
}

void Transformer::forward_all_logits(Activations& a, const Tensor& tokens, Tensor logits,
                                     const PackedBatchInfo* packed) {
  NK_CHECK(!tp_.active(), "forward_all_logits: the logits are split under tensor parallelism");
  int64_t N = a.B * a.T;
  check_shape(logits, {N, cfg_.vocab_size}, "logits");
  forward_body(a, tokens, packed);
  for (int64_t r = 0; r < N; r += a.chunk) {
    int64_t n = std::min(a.chunk, N - r);
    Tensor chunk = a.logits.narrow0(0, n);
    head_.forward(chunk, nn::rows(a.lnf).narrow0(r, n));
    ops::convert(logits.narrow0(r, n), chunk);
  }
}

void Transformer::forward_last_logits(Activations& a, const Tensor& tokens, Tensor logits) {
  NK_CHECK(!tp_.active(), "forward_last_logits: the logits are split under tensor parallelism");
  check_shape(logits, {a.B, cfg_.vocab_size}, "logits");
  forward_body(a, tokens, nullptr);
  // Gather the last position of each sequence, then one small head product.
  for (int64_t b = 0; b < a.B; ++b) {
    Tensor last = nn::rows(a.lnf).narrow0(b * a.T + a.T - 1, 1);
    Tensor out = a.logits.narrow0(0, 1);
    head_.forward(out, last);
    ops::convert(logits.narrow0(b, 1), out);
  }
}

void Transformer::forward_cached(KVCache& kc, const CachedStep& st, Tensor logits) {
  NK_CHECK(stage_.whole(cfg_), "forward_cached on one pipeline stage");
  NK_CHECK(!tp_.active(), "forward_cached: inference under tensor parallelism is not supported");
  const int64_t N = int64_t(st.tokens.size()), R = int64_t(st.logit_rows.size());
  const int64_t M = kc.shape().table_width(), Q = int64_t(st.block_table.size()) / M;
  NK_CHECK(N > 0 && N <= kc.max_tokens(),
           "forward_cached: {} tokens, the cache's workspace holds {}", N, kc.max_tokens());
  NK_CHECK(int64_t(st.seqs.size()) == N && int64_t(st.positions.size()) == N,
           "forward_cached: {} tokens but {} sequences and {} positions", N, st.seqs.size(),
           st.positions.size());
  NK_CHECK(Q > 0 && Q <= kc.shape().max_seqs && int64_t(st.block_table.size()) == Q * M,
           "forward_cached: a block table of {} entries is not [Q <= {}, {}]",
           st.block_table.size(), kc.shape().max_seqs, M);
  NK_CHECK(kc.dtype() == compute_ && int64_t(kc.k.size()) == cfg_.n_layer,
           "forward_cached: cache ({} layers, {}) does not fit the model ({} layers, {})",
           kc.k.size(), dtype_name(kc.dtype()), cfg_.n_layer, dtype_name(compute_));
  check_shape(logits, {R, cfg_.vocab_size}, "logits");
  check_dtype(logits, DType::F32, "logits");
  Tensor tok = kc.tokens.narrow0(0, N), seq = kc.seq_ids.narrow0(0, N),
         pos = kc.positions.narrow0(0, N), table = kc.table.narrow0(0, Q);
  ops::copy_bytes_from_host(tok, st.tokens.data());
  ops::copy_bytes_from_host(seq, st.seqs.data());
  ops::copy_bytes_from_host(pos, st.positions.data());
  ops::copy_bytes_from_host(table, st.block_table.data());
  Tensor tok2 = tok.view({1, N}), pos2 = pos.view({1, N});
  Tensor x = kc.x.narrow0(0, N), ln = kc.ln.narrow0(0, N), tmp = kc.tmp.narrow0(0, N);
  Tensor mean = kc.mean.narrow0(0, N), rstd = kc.rstd.narrow0(0, N);
  const nn::AdapterActs ad = kc.adapters
                                 ? nn::AdapterActs{kc.lora_h, kc.adapters.get(), kc.adapter_stats}
                                 : nn::AdapterActs{};
  nn::MLP::Saved mlp{kc.h.narrow0(0, N), kc.a.narrow0(0, N), ad, ad, Tensor(), Tensor()};
  embed_.forward(x.view({1, N, cfg_.d_model}), tok2, pos2);
  if (prompt_.active()) {
    const int64_t n = prompt_.n();
    Tensor p;  // computed once, if any token is a virtual one
    for (int64_t i = 0; i < N; ++i) {
      const int32_t at = st.positions[size_t(i)];
      if (at >= n) continue;
      if (!p.defined()) p = prompt_.forward(kc.prompt);
      Tensor dst = x.narrow0(i, 1);
      if (embed_.wpe.defined())
        ops::add(dst, p.narrow0(at, 1), embed_.wpe.narrow0(at, 1));
      else
        ops::convert(dst, p.narrow0(at, 1));
    }
  }
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const Block& b = blocks_[l];
    b.norm1.forward(ln, mean, rstd, x);
    b.attn.forward_cached(tmp, kc.qkv.narrow0(0, N), kc.att.narrow0(0, N), ln, kc.k[l], kc.v[l],
                          table, seq, pos2, ad);
    ops::add(x, x, tmp);
    b.norm2.forward(ln, mean, rstd, x);
    b.mlp.forward(tmp, mlp, ln);
    ops::add(x, x, tmp);
  }
  // The final norm and the head only for the rows whose logits are wanted,
  // gathered head_rows at a time.
  for (int64_t r = 0; r < R; r += kc.head_rows) {
    const int64_t n = std::min(kc.head_rows, R - r);
    Tensor sel = kc.sel.narrow0(0, n);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t row = st.logit_rows[size_t(r + i)];
      NK_CHECK(row >= 0 && row < N, "forward_cached: logit row {} outside [0, {})", row, N);
      ops::convert(sel.narrow0(i, 1), x.narrow0(row, 1));
    }
    Tensor normed = kc.ln.narrow0(0, n);
    norm_f_.forward(normed, kc.mean.narrow0(0, n), kc.rstd.narrow0(0, n), sel);
    Tensor out = kc.head_logits.narrow0(0, n);
    head_.forward(out, normed);
    ops::convert(logits.narrow0(r, n), out);
  }
}

}  // namespace nk
