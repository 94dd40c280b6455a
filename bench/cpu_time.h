// CPU seconds the process has used: what a benchmark on a shared machine
// times when it wants the work it got, not the wall clock it waited.
#pragma once
#include <ctime>

namespace nk::bench {

inline double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

}  // namespace nk::bench
