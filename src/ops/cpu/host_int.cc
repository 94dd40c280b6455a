// Integer-tensor helpers (token ids) for the CPU backend.
#include <cstring>

#include "ops/ops.h"

namespace nk::ops {

void copy_bytes_from_host(Tensor dst, const void* src) {
  NK_CHECK(dst.device() == Device::CPU && dst.is_contiguous(), "copy_bytes_from_host to {}",
           dst.desc());
  std::memcpy(dst.raw(), src, dst.nbytes());
}

int64_t count_not_equal(const Tensor& x, int64_t value) {
  NK_CHECK(x.device() == Device::CPU && x.is_contiguous(), "count_not_equal on {}", x.desc());
  const int32_t* p = x.data<int32_t>();
  int64_t n = 0;
  for (int64_t i = 0; i < x.numel(); ++i) n += p[i] != value;
  return n;
}

}  // namespace nk::ops
