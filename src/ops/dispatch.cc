#include "ops/dispatch.h"

namespace nk::ops {

Device device_of(const char* op, std::initializer_list<Arg> args) {
  const Arg* first = nullptr;
  for (const Arg& a : args) {
    if (!a.t->defined()) {
      NK_CHECK(a.optional, "{}: {} is undefined", op, a.name);
      continue;
    }
    NK_CHECK(a.t->is_contiguous(), "{}: {} ({}) is not contiguous", op, a.name, a.t->desc());
    if (!first) first = &a;
    NK_CHECK(a.t->device() == first->t->device(), "{}: {} is on {} but {} is on {}", op, a.name,
             device_name(a.t->device()), first->name, device_name(first->t->device()));
  }
  NK_CHECK(first, "{}: no tensor argument is defined", op);
  return first->t->device();
}

void no_kernel(const char* op, Device device) {
  fail("{}: no kernel for device '{}' in this build", op, device_name(device));
}

}  // namespace nk::ops
