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
