#include "train/adamw.h"

namespace nk {

AdamW::AdamW(Transformer& model, const AdamWConfig& cfg) : model_(model), cfg_(cfg) {
  int64_t n = model.layout().total();
  m_ = Tensor::zeros({n}, DType::F32);
  v_ = Tensor::zeros({n}, DType::F32);
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

void AdamW::step(double lr, float grad_scale) {
  ++step_;
  int64_t n = model_.layout().total(), split = model_.layout().decay_end();
  bool copy = model_.compute_params().raw() != model_.params().raw();
  auto run = [&](int64_t begin, int64_t end, double wd) {
    if (end <= begin) return;
    ops::AdamWParams p{float(lr), float(cfg_.beta1), float(cfg_.beta2), float(cfg_.eps), float(wd),
                       step_,     grad_scale};
    auto part = [&](const Tensor& t) { return t.narrow0(begin, end - begin); };
    ops::adamw_step(part(model_.params()), part(model_.grads()), part(m_), part(v_), p,
                    copy ? part(model_.compute_params()) : Tensor());
  };
  run(0, split, cfg_.weight_decay);
  run(split, n, 0.0);
}

}  // namespace nk
