// AdamW over flat f32 buffers: checks, then the device's kernel.
#include <initializer_list>

#include "ops/dispatch.h"
#include "ops/ops.h"

namespace nk::ops {

void adamw_step(Tensor param, const Tensor& grad, Tensor m, Tensor v, const AdamWParams& p,
                Tensor param_copy) {
  const char* op = "adamw_step";
  const Device dev = device_of(op, {{&param, "param"},
                                    {&grad, "grad"},
                                    {&m, "m"},
                                    {&v, "v"},
                                    {&param_copy, "param_copy", kOptional}});
  for (const Tensor* t : std::initializer_list<const Tensor*>{&param, &grad, &m, &v}) {
    check_dtype(*t, DType::F32, "adamw buffer");
    NK_CHECK(t->numel() == param.numel(), "{}: {} vs param {}", op, t->desc(), param.desc());
  }
  NK_CHECK(p.step >= 1, "{}: step {} must be >= 1", op, p.step);
  if (param_copy.defined())
    NK_CHECK(param_copy.numel() == param.numel(), "{}: param_copy {} vs param {}", op,
             param_copy.desc(), param.desc());
  NK_KERNEL(adamw_step, dev)(param, grad, m, v, p, param_copy);
}

}  // namespace nk::ops

namespace nk::ops {

void adamw_step_mixed(Tensor master, Tensor remainder, const Tensor& grad, Tensor m, Tensor v,
                      Tensor scales, const AdamWParams& p, Tensor param_copy) {
  const char* op = "adamw_step_mixed";
  const Device dev = device_of(op, {{&master, "master"},
                                    {&remainder, "remainder", kOptional},
                                    {&grad, "grad"},
                                    {&m, "m"},
                                    {&v, "v"},
                                    {&scales, "scales", kOptional},
                                    {&param_copy, "param_copy", kOptional}});
  const int64_t n = master.numel();
  NK_CHECK(master.dtype() == DType::F32 || master.dtype() == DType::BF16,
           "{}: master {} is neither f32 nor bf16", op, master.desc());
  check_dtype(grad, DType::F32, "adamw grad");
  NK_CHECK(m.dtype() == v.dtype() &&
               (m.dtype() == DType::F32 || m.dtype() == DType::BF16 || m.dtype() == DType::F16),
           "{}: moments {} and {} are not one of f32, bf16, f16", op, m.desc(), v.desc());
  for (const Tensor* t : std::initializer_list<const Tensor*>{&grad, &m, &v})
    NK_CHECK(t->numel() == n, "{}: {} vs master {}", op, t->desc(), master.desc());
  if (master.dtype() == DType::BF16)
    NK_CHECK(!param_copy.defined(), "{}: a bf16 master is the compute copy itself", op);
  else
    NK_CHECK(!remainder.defined(), "{}: a remainder goes with a bf16 master only", op);
  if (remainder.defined())
    NK_CHECK(remainder.dtype() == DType::BF16 && remainder.numel() == n,
             "{}: remainder {} vs master {}", op, remainder.desc(), master.desc());
  if (param_copy.defined())
    NK_CHECK(param_copy.numel() == n, "{}: param_copy {} vs master {}", op, param_copy.desc(),
             master.desc());
  if (m.dtype() == DType::F16)
    NK_CHECK(scales.defined() && scales.dtype() == DType::F32 && scales.numel() == 2,
             "{}: f16 moments need f32 [2] scales, got {}", op,
             scales.defined() ? scales.desc() : std::string("none"));
  NK_CHECK(p.step >= 1, "{}: step {} must be >= 1", op, p.step);
  NK_KERNEL(adamw_step_mixed, dev)(master, remainder, grad, m, v, scales, p, param_copy);
}

}  // namespace nk::ops

namespace nk::ops {

namespace {
void check_master_parts(const char* op, const Tensor& f32, const Tensor& hi,
                        const Tensor& remainder) {
  check_dtype(f32, DType::F32, "f32 master");
  check_dtype(hi, DType::BF16, "bf16 master");
  NK_CHECK(hi.numel() == f32.numel(), "{}: {} vs {}", op, hi.desc(), f32.desc());
  if (remainder.defined())
    NK_CHECK(remainder.dtype() == DType::BF16 && remainder.numel() == f32.numel(),
             "{}: remainder {} vs {}", op, remainder.desc(), f32.desc());
}
}  // namespace

void bf16_master_split(Tensor hi, Tensor remainder, const Tensor& f32) {
  const char* op = "bf16_master_split";
  const Device dev =
      device_of(op, {{&hi, "hi"}, {&remainder, "remainder", kOptional}, {&f32, "f32"}});
  check_master_parts(op, f32, hi, remainder);
  NK_KERNEL(bf16_master_split, dev)(hi, remainder, f32);
}

void bf16_master_join(Tensor f32, const Tensor& hi, const Tensor& remainder) {
  const char* op = "bf16_master_join";
  const Device dev =
      device_of(op, {{&f32, "f32"}, {&hi, "hi"}, {&remainder, "remainder", kOptional}});
  check_master_parts(op, f32, hi, remainder);
  NK_KERNEL(bf16_master_join, dev)(f32, hi, remainder);
}

}  // namespace nk::ops
