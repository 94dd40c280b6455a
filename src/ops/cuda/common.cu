#include "ops/cuda/common.cuh"

namespace nk::ops::cuda {

ErrorFlag::ErrorFlag() {
  flag_ = static_cast<int64_t*>(nk::cuda::allocate(2 * sizeof(int64_t)));
  nk::cuda::memset_zero(flag_, 2 * sizeof(int64_t));
}

ErrorFlag::~ErrorFlag() {
  try {
    nk::cuda::deallocate(flag_);
  } catch (...) {  // a destructor never throws; the device error resurfaces at the next call
  }
}

std::pair<int64_t, int64_t> ErrorFlag::read() const {
  int64_t h[2];
  nk::cuda::copy_to_host(h, flag_, sizeof(h));
  return h[0] == 0 ? std::pair<int64_t, int64_t>{-1, 0}
                   : std::pair<int64_t, int64_t>{h[0] - 1, h[1]};
}

}  // namespace nk::ops::cuda
