#include "core/parallel.h"

#include <omp.h>

#include <algorithm>

namespace nk {

int num_threads() {
  return omp_get_max_threads();
}

void set_num_threads(int n) {
  omp_set_num_threads(n > 0 ? n : omp_get_num_procs());
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  int64_t chunks = std::min<int64_t>(num_threads(), (n + grain - 1) / std::max<int64_t>(grain, 1));
  if (chunks <= 1 || omp_in_parallel()) {
    fn(0, n);
    return;
  }
#pragma omp parallel for num_threads(int(chunks)) schedule(static, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
    if (b < e) fn(b, e);
  }
}

}  // namespace nk
