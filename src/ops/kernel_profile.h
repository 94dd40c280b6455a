// Where a step's time goes, kernel by kernel (train.profile=true). When
// profiling is on, the fronts reach the CPU kernels through a copy of the
// active level's table (ops/cpu_kernels.h), and in a CUDA build the CUDA
// kernels through a copy of theirs (ops/cuda_kernels.h), whose every entry
// is a wrapper that times the call and adds it to that kernel's counters:
// the same kernels, the same arguments, so the numbers computed do not
// change. CPU times are self times: a kernel that calls another through the
// table does not count the inner call twice. CUDA kernels return before the
// device runs them: each outermost call is bracketed by two timing events
// on the compute stream, read when the counters are (kernel_profile and
// reset_kernel_profile wait for the device), so its time is the device's
// from the call's start to its end.
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
