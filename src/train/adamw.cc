#include "train/adamw.h"

#include <algorithm>

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
  if (arenas_.grads.defined()) check_arena(arenas_.grads, "grads");
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
  // The moments live beside the weights they update.
  m_ = Tensor::empty({state}, DType::F32, arenas_.params.device());
  v_ = Tensor::empty({state}, DType::F32, arenas_.params.device());
  ops::fill(m_, 0.f);
  ops::fill(v_, 0.f);
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

void AdamW::load_state(Tensor m, Tensor v, int64_t steps_done) {
  for (const Tensor* t : {&m, &v})
    NK_CHECK(t->dtype() == DType::F32 && t->shape() == m_.shape() && t->is_contiguous(),
             "AdamW::load_state: moment {} does not match {}", t->desc(), m_.desc());
  NK_CHECK(steps_done >= 0, "AdamW::load_state: negative step count {}", steps_done);
  m_ = std::move(m);
  v_ = std::move(v);
  step_ = steps_done;
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
    ops::convert(m_.narrow0(state_offset_[i], g.shard_size()),
                 m.narrow0(g.shard_begin, g.shard_size()));
    ops::convert(v_.narrow0(state_offset_[i], g.shard_size()),
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
    auto arena = [&](const Tensor& t) { return t.narrow0(g.shard_begin, len); };
    auto state = [&](const Tensor& t) { return t.narrow0(state_offset_[i], len); };
    ops::adamw_step(arena(arenas_.params), arena(arenas_.grads), state(m_), state(v_), p,
                    arenas_.compute.defined() ? arena(arenas_.compute) : Tensor());
  }
}

}  // namespace nk
