// Where a CPU step's time goes, kernel by kernel (train.profile=true). When
// profiling is on, the fronts reach the CPU kernels through a copy of the
// active level's table (ops/cpu_kernels.h) whose every entry is a wrapper
// that times the call and adds it to that kernel's counters: the same
// kernels, the same arguments, so the numbers computed do not change. Times
// are self times: a kernel that calls another through the table does not
// count the inner call twice. CUDA kernels run asynchronously and are not
// timed here (train.profile refuses train.device=cuda).
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

namespace nk::ops {

// Turns the timing wrappers on or off for the whole process (the calls in
// flight on other threads finish with the table they started with).
void set_kernel_profiling(bool on);
bool kernel_profiling();

// One kernel's counters since the last reset: calls and self seconds.
struct KernelTime {
  std::string_view name;
  int64_t calls = 0;
  double seconds = 0;
};

// Every kernel called since the last reset, slowest first.
std::vector<KernelTime> kernel_profile();
void reset_kernel_profile();

}  // namespace nk::ops
