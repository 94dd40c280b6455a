// The one thread pool. It is OpenMP's, which oneDNN and OpenBLAS share, so
// kernels and library calls never oversubscribe the cores.
#pragma once
#include <cstdint>
#include <functional>

namespace nk {

int num_threads();
void set_num_threads(int n);  // n <= 0: all cores

// Calls fn(begin, end) on disjoint chunks of [0, n), at least `grain` items each.
// The split depends only on n, grain and the thread count, so results that are
// reduced per chunk are deterministic run to run.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace nk
