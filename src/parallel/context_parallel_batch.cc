#include "parallel/context_parallel_batch.h"

#include <algorithm>

#include "core/error.h"
#include "nn/context_parallel.h"

namespace nk::parallel {

void cp_local_rows(const Tensor& full, Tensor local, int64_t rank, int64_t cp) {
  check_dtype(full, DType::I32, "context-parallel tokens");
  check_dtype(local, DType::I32, "context-parallel local tokens");
  const int64_t B = full.dim(0), T = full.dim(1);
  if (T % (2 * cp))
    fail("parallel.cp = {}: train.seq_len = {} is not a multiple of 2 × parallel.cp = {}", cp, T,
         2 * cp);
  const int64_t c = T / (2 * cp);
  check_shape(local, {B, 2 * c}, "context-parallel local tokens");
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* src = full.data<int32_t>() + b * T;
    int32_t* dst = local.data<int32_t>() + b * 2 * c;
    std::copy_n(src + rank * c, c, dst);
    std::copy_n(src + (2 * cp - 1 - rank) * c, c, dst + c);
  }
}

void cp_local_positions(Tensor positions, int64_t rank, int64_t cp) {
  check_dtype(positions, DType::I32, "context-parallel positions");
  const int64_t B = positions.dim(0), Tl = positions.dim(1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tl; ++t)
      positions.data<int32_t>()[b * Tl + t] = int32_t(nn::cp_global_position(t, rank, cp, Tl / 2));
}

}  // namespace nk::parallel
