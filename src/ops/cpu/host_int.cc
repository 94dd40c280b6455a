// Raw byte copies and integer-tensor helpers (token ids) for the CPU backend.
#include <cstring>

#include "ops/cpu/kernels.h"
#include "ops/cpu/level.h"

namespace nk::ops::NK_CPU_NS {

void copy_bytes_from_host(Tensor dst, const void* src) {
  std::memcpy(dst.raw(), src, dst.nbytes());
}

void copy_bytes_to_host(const Tensor& src, void* dst) {
  std::memcpy(dst, src.raw(), src.nbytes());
}

int64_t count_not_equal(const Tensor& x, int64_t value) {
  const int32_t* p = x.data<int32_t>();
  int64_t n = 0;
  for (int64_t i = 0; i < x.numel(); ++i) n += p[i] != value;
  return n;
}

void synchronize() {}  // a CPU op is done when it returns

}  // namespace nk::ops::NK_CPU_NS
