#include "train/adamw.h"

#include <algorithm>
#include <cmath>

namespace nk {

namespace {

void check_arena(const Tensor& t, const char* name) {
  NK_CHECK(t.dtype() == DType::F32 && t.ndim() == 1 && t.is_contiguous(),
           "AdamW: {} arena {} is not a flat f32 buffer", name, t.desc());
}

}  // namespace

AdamW::AdamW(ParamArenas arenas, std::vector<ParamGroup> groups, const AdamWConfig& cfg)
    : arenas_(std::move(arenas)), groups_(std::move(groups)), cfg_(cfg) {
  check_arena(arenas_.params, "params");
  const int64_t n = arenas_.params.numel();
  const int64_t n_grads = arenas_.grads.defined() ? arenas_.grads.numel() : 0;
  if (arenas_.grads.defined()) {
    NK_CHECK(arenas_.grads.dtype() == cfg_.precision.grads && arenas_.grads.ndim() == 1 &&
                 arenas_.grads.is_contiguous(),
             "AdamW: grads arena {} is not a flat {} buffer (optim.grad_dtype)",
             arenas_.grads.desc(), dtype_name(cfg_.precision.grads));
  }
  NK_CHECK(!arenas_.compute.defined() || arenas_.compute.numel() == n,
           "AdamW: compute arena {} does not match params {}", arenas_.compute.desc(),
           arenas_.params.desc());
  int64_t state = 0;
  for (const ParamGroup& g : groups_) {
    NK_CHECK(0 <= g.begin && g.begin <= g.end && g.end <= n,
             "AdamW: group '{}' [{}, {}) lies outside the params arena [0, {})", g.name, g.begin,
             g.end, n);
    NK_CHECK(g.begin <= g.shard_begin && g.shard_begin <= g.shard_end && g.shard_end <= g.end,
             "AdamW: group '{}': shard [{}, {}) lies outside the group [{}, {})", g.name,
             g.shard_begin, g.shard_end, g.begin, g.end);
    NK_CHECK(!g.trainable || g.end <= n_grads,
             "AdamW: trainable group '{}' [{}, {}) lies outside the grads arena [0, {})", g.name,
             g.begin, g.end, n_grads);
    NK_CHECK(g.lr_scale >= 0 && g.weight_decay >= 0,
             "AdamW: group '{}': lr_scale {} and weight_decay {} must be >= 0", g.name, g.lr_scale,
             g.weight_decay);
    state_offset_.push_back(state);
    if (g.trainable) state += g.shard_size();
  }
  std::vector<const ParamGroup*> by_begin;
  for (const ParamGroup& g : groups_) by_begin.push_back(&g);
  std::sort(by_begin.begin(), by_begin.end(),
            [](const ParamGroup* a, const ParamGroup* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_begin.size(); ++i)
    NK_CHECK(by_begin[i - 1]->end <= by_begin[i]->begin, "AdamW: groups '{}' and '{}' overlap",
             by_begin[i - 1]->name, by_begin[i]->name);
  const OptimPrecision& pr = cfg_.precision;
  NK_CHECK(pr.moments == DType::F32 || pr.moments == DType::BF16 || pr.moments == DType::F16,
           "AdamW: moments in {}", dtype_name(pr.moments));
  NK_CHECK(pr.grads == DType::F32 || pr.grads == DType::BF16, "AdamW: gradients in {}",
           dtype_name(pr.grads));
  // f16 moments pick their scales over a whole group in one call: not chunk by chunk.
  if (pr.grads == DType::BF16 && pr.moments == DType::F16)
    fail("optim.grad_dtype=bf16 does not go with optim.moment_dtype=f16 yet; use bf16 or f32");
  // The moments live beside the weights they update.
  const Device dev = arenas_.params.device();
  if (pr.grads == DType::BF16 && n_grads > 0)
    grad_f32_ = Tensor::empty({std::min(kGradChunk, n_grads)}, DType::F32, dev);
  m_ = Tensor::empty({state}, pr.moments, dev);
  v_ = Tensor::empty({state}, pr.moments, dev);
  ops::fill(m_, 0.f);
  ops::fill(v_, 0.f);
  if (pr.moments == DType::F16) {
    scales_ = Tensor::empty({int64_t(groups_.size()) * 2}, DType::F32, dev);
    ops::fill(scales_, 1.f);
  }
  n_params_ = n;
  if (pr.master == DType::F32) return;
  NK_CHECK(pr.master == DType::BF16, "AdamW: master weights in {}", dtype_name(pr.master));
  if (!arenas_.compute.defined() || arenas_.compute.dtype() != DType::BF16)
    fail("optim.master_dtype=bf16 needs train.dtype=bf16 (the bf16 weights are the master)");
  // The remainder of each f32 master; from now on the compute arena and it are the master.
  if (pr.compensation) {
    remainder_ = Tensor::empty({state}, DType::BF16, dev);
    for (size_t i = 0; i < groups_.size(); ++i) {
      const ParamGroup& g = groups_[i];
      if (!g.trainable || g.shard_size() == 0) continue;
      ops::bf16_master_split(arenas_.compute.narrow0(g.shard_begin, g.shard_size()),
                             remainder_.narrow0(state_offset_[i], g.shard_size()),
                             arenas_.params.narrow0(g.shard_begin, g.shard_size()));
    }
  }
  arenas_.params = Tensor();  // no view keeps the f32 arena the caller frees
}

int64_t AdamW::state_bytes() const {
  int64_t n = int64_t(m_.nbytes() + v_.nbytes());
  if (scales_.defined()) n += int64_t(scales_.nbytes());
  if (remainder_.defined()) n += int64_t(remainder_.nbytes());
  if (grad_f32_.defined()) n += int64_t(grad_f32_.nbytes());
  return n;
}

Tensor AdamW::masters_f32() const {
  if (!master_in_compute()) return arenas_.params;
  Tensor out = Tensor::empty({n_params_}, DType::F32, arenas_.compute.device());
  ops::convert(out, arenas_.compute);
  if (remainder_.defined())
    for (size_t i = 0; i < groups_.size(); ++i) {
      const ParamGroup& g = groups_[i];
      if (!g.trainable || g.shard_size() == 0) continue;
      ops::bf16_master_join(out.narrow0(g.shard_begin, g.shard_size()),
                            arenas_.compute.narrow0(g.shard_begin, g.shard_size()),
                            remainder_.narrow0(state_offset_[i], g.shard_size()));
    }
  return out;
}

namespace {

// f16 moments are host-side here (the only backend); x *= s, or (x s)^2 for sqrt(v).
void unscale(Tensor t, float s, bool square) {
  NK_CHECK(t.on_host(), "AdamW: f16 moments on {} are not supported", device_name(t.device()));
  float* x = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) x[i] = square ? (x[i] * s) * (x[i] * s) : x[i] * s;
}

// The kernel's f16 scale for the largest magnitude (ops/cpu/adamw.cc).
float f16_scale(float largest) {
  if (!(largest > 0.f) || !std::isfinite(largest)) return 1.f;
  return std::ldexp(1.f, std::max(std::ilogb(largest) - 14, -126));
}

}  // namespace

// A stored moment's values in f32: itself when f32, else widened and, for
// f16, unscaled group by group (scale `which` of each group's two; sqrt:
// the stored value is sqrt(v)).
Tensor AdamW::moment_f32(const Tensor& stored, int which, bool sqrt) const {
  if (stored.dtype() == DType::F32) return stored;
  Tensor out = Tensor::empty({stored.numel()}, DType::F32, stored.device());
  ops::convert(out, stored);
  if (scales_.defined())
    for (size_t i = 0; i < groups_.size(); ++i)
      if (groups_[i].trainable && groups_[i].shard_size() > 0)
        unscale(out.narrow0(state_offset_[i], groups_[i].shard_size()),
                scales_.data<float>()[2 * i + size_t(which)], sqrt);
  return out;
}

void AdamW::store_moments(size_t i, const Tensor& m, const Tensor& v) {
  const int64_t len = groups_[i].shard_size();
  Tensor sm = m_.narrow0(state_offset_[i], len), sv = v_.narrow0(state_offset_[i], len);
  if (!scales_.defined()) {  // f32 or bf16 (rounded to nearest even)
    ops::convert(sm, m);
    ops::convert(sv, v);
    return;
  }
  // f16: m / scale and sqrt(v) / scale, the scales as the kernel picks them.
  NK_CHECK(m.on_host() && v.on_host(), "AdamW: f16 moments on {} are not supported",
           device_name(m.device()));
  std::vector<float> a(static_cast<size_t>(len)), r(static_cast<size_t>(len));
  float max_m = 0.f, max_r = 0.f;
  const float *pm = m.data<float>(), *pv = v.data<float>();
  for (int64_t j = 0; j < len; ++j) {
    a[size_t(j)] = pm[j];
    r[size_t(j)] = std::sqrt(std::max(pv[j], 0.f));
    max_m = std::max(max_m, std::fabs(pm[j]));
    max_r = std::max(max_r, r[size_t(j)]);
  }
  float* scales = scales_.data<float>() + 2 * i;
  scales[0] = f16_scale(max_m);
  scales[1] = f16_scale(max_r);
  for (int64_t j = 0; j < len; ++j) {
    a[size_t(j)] /= scales[0];
    r[size_t(j)] /= scales[1];
  }
  ops::convert(sm, Tensor::from_blob(a.data(), {len}, DType::F32));
  ops::convert(sv, Tensor::from_blob(r.data(), {len}, DType::F32));
}

AdamW::AdamW(Transformer& model, const AdamWConfig& cfg)
    : AdamW(model_arenas(model),
            default_param_groups(model.layout(), cfg.weight_decay, model.params().numel()), cfg) {}

bool AdamW::state_mirrors_arenas() const {
  for (size_t i = 0; i < groups_.size(); ++i) {
    const ParamGroup& g = groups_[i];
    if (g.trainable && (g.shard_begin != g.begin || g.shard_end != g.end ||
                        (g.shard_size() > 0 && state_offset_[i] != g.begin)))
      return false;
  }
  return true;
}

void AdamW::load_state(const Tensor& m, const Tensor& v, int64_t steps_done) {
  for (const Tensor* t : {&m, &v})
    NK_CHECK(t->dtype() == DType::F32 && t->shape() == m_.shape() && t->is_contiguous(),
             "AdamW::load_state: moment {} does not match {}", t->desc(), m_.desc());
  NK_CHECK(steps_done >= 0, "AdamW::load_state: negative step count {}", steps_done);
  step_ = steps_done;
  if (m_.dtype() == DType::F32) {
    m_ = m;
    v_ = v;
    return;
  }
  for (size_t i = 0; i < groups_.size(); ++i)
    if (groups_[i].trainable && groups_[i].shard_size() > 0)
      store_moments(i, m.narrow0(state_offset_[i], groups_[i].shard_size()),
                    v.narrow0(state_offset_[i], groups_[i].shard_size()));
}

void AdamW::load_arena_state(const Tensor& m, const Tensor& v, int64_t steps_done) {
  const int64_t n = arenas_.grads.defined() ? arenas_.grads.numel() : 0;
  for (const Tensor* t : {&m, &v})
    NK_CHECK(t->dtype() == DType::F32 && t->ndim() == 1 && t->numel() == n && t->is_contiguous(),
             "AdamW::load_arena_state: moment {} is not laid out like the grads arena [{}]",
             t->desc(), n);
  NK_CHECK(steps_done >= 0, "AdamW::load_arena_state: negative step count {}", steps_done);
  for (size_t i = 0; i < groups_.size(); ++i) {
    const ParamGroup& g = groups_[i];
    if (!g.trainable || g.shard_size() == 0) continue;
    store_moments(i, m.narrow0(g.shard_begin, g.shard_size()),
                  v.narrow0(g.shard_begin, g.shard_size()));
  }
  step_ = steps_done;
}

void AdamW::step(double lr, float grad_scale) {
  ++step_;
  for (size_t i = 0; i < groups_.size(); ++i) {
    const ParamGroup& g = groups_[i];
    const int64_t len = g.shard_size();
    if (!g.trainable || len == 0) continue;
    ops::AdamWParams p{float(lr * g.lr_scale),
                       float(cfg_.beta1),
                       float(cfg_.beta2),
                       float(cfg_.eps),
                       float(g.weight_decay),
                       step_,
                       grad_scale};
    // Elements [at, at + n) of the group's shard, with their f32 gradients.
    auto update = [&](int64_t at, int64_t n, const Tensor& grad) {
      auto arena = [&](const Tensor& t) { return t.narrow0(g.shard_begin + at, n); };
      auto state = [&](const Tensor& t) { return t.narrow0(state_offset_[i] + at, n); };
      const Tensor copy = arenas_.compute.defined() ? arena(arenas_.compute) : Tensor();
      if (!cfg_.precision.reduced()) {
        ops::adamw_step(arena(arenas_.params), grad, state(m_), state(v_), p, copy);
        return;
      }
      const bool in_compute = master_in_compute();
      ops::adamw_step_mixed(in_compute ? copy : arena(arenas_.params),
                            remainder_.defined() ? state(remainder_) : Tensor(), grad, state(m_),
                            state(v_),
                            scales_.defined() ? scales_.narrow0(2 * int64_t(i), 2) : Tensor(), p,
                            in_compute ? Tensor() : copy);
    };
    if (!grad_f32_.defined()) {
      update(0, len, arenas_.grads.narrow0(g.shard_begin, len));
      continue;
    }
    for (int64_t at = 0; at < len; at += grad_f32_.numel()) {
      const int64_t n = std::min(grad_f32_.numel(), len - at);
      Tensor grad = grad_f32_.narrow0(0, n);
      ops::convert(grad, arenas_.grads.narrow0(g.shard_begin + at, n));
      update(at, n, grad);
    }
  }
}

}  // namespace nk
