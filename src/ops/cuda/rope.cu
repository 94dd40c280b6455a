// Rotary position embedding on CUDA (arguments checked by ops/rope.cc; CPU
// twin in ops/cpu/rope.cc), Hugging Face rotate-half convention: within each
// head of width D, element i of its first R (the table's width: partial
// rotary when R < D) pairs with i + R/2; the rest pass through. One thread
// per rotated pair.
// Position ids read from device memory are checked first; a bad one leaves x
// untouched and is an nk::Error with the CPU's text.
#include <optional>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"

namespace nk::ops::cuda {
namespace {

// Reports positions pos i32[n] outside [0, max_t).
__global__ void check_positions_kernel(const int32_t* pos, int64_t n, int64_t max_t,
                                       DeviceError err) {
  NK_GRID_STRIDE(i, n) {
    if (pos[i] < 0 || pos[i] >= max_t) report(err, i, pos[i]);
  }
}

// x T[rows, W] (rows = B*T): the pairs (i, i + R/2) of heads h < H (of width D >= R)
// rotated by the angles of row r's position, pos ? pos[r] : pos0 + r % T, read from
// cs f32[maxT, R] = [cos | sin]; sign -1 applies the transpose. Nothing when *bad (a
// position failed its check).
template <typename T>
__global__ void rope_kernel(T* x, int64_t rows, int64_t T_, int64_t W, int64_t H, int64_t D,
                            int64_t R, const float* cs, int64_t pos0, const int32_t* pos,
                            float sign, const int64_t* bad) {
  if (bad && *bad != 0) return;
  const int64_t half = R / 2, per_row = H * half;
  NK_GRID_STRIDE(i, rows * per_row) {
    const int64_t r = i / per_row, rem = i % per_row, h = rem / half, k = rem % half;
    const float* cos_row = cs + (pos ? int64_t(pos[r]) : pos0 + r % T_) * R;
    const float c = cos_row[k], s = sign * cos_row[half + k];
    T* a = x + r * W + h * D + k;
    const float x1 = load(a[0]), x2 = load(a[half]);
    a[0] = store<T>(x1 * c - x2 * s);
    a[half] = store<T>(x2 * c + x1 * s);
  }
}

}  // namespace

void rope_inplace(Tensor x, int64_t n_heads, int64_t head_dim, const Tensor& table, int64_t pos0,
                  const Tensor& positions, bool inverse) {
  const int64_t T_ = x.dim(1), W = x.dim(2), rows = x.dim(0) * T_, max_t = table.dim(0);
  const int64_t R = table.dim(1), pairs = rows * n_heads * (R / 2);
  // Positions come from the data: checked on the device before x is touched.
  const int32_t* pos = positions.defined() ? positions.data<int32_t>() : nullptr;
  std::optional<ErrorFlag> flag;
  if (pos && rows > 0) {
    flag.emplace();
    check_positions_kernel<<<blocks_for(rows), kThreads, 0, nk::cuda::stream()>>>(pos, rows, max_t,
                                                                                  flag->device());
    NK_CUDA_LAUNCHED("check_positions_kernel");
  }
  if (pairs > 0) {
    dispatch_float(x.dtype(), "rope_inplace", [&](auto tag) {
      using T = decltype(tag);
      rope_kernel<T><<<blocks_for(pairs), kThreads, 0, nk::cuda::stream()>>>(
          x.data<T>(), rows, T_, W, n_heads, head_dim, R, table.data<float>(), pos0, pos,
          inverse ? -1.f : 1.f, flag ? flag->device().flag : nullptr);
      NK_CUDA_LAUNCHED("rope_kernel");
    });
  }
  if (!flag) return;
  const auto [n, bad] = flag->read();  // waits for the kernels
  if (n >= 0)
    fail("rope_inplace: position id {} at (batch {}, t {}) is outside the table's [0, {})", bad,
         n / T_, n % T_, max_t);
}

}  // namespace nk::ops::cuda
