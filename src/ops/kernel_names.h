// The kernel lists as data: the names of ops/kernel_list.h's kernels (every
// backend has each one) and of ops/cpu/cpu_only_kernel_list.h's (the CPU's
// alone), in list order, expanded from the same lines that declare them.
// tests/ops/kernel_coverage_test.cc walks both to prove that each kernel has
// a test case (on every backend for the shared list).
#pragma once
#include <string_view>

namespace nk::ops {

inline constexpr std::string_view kKernelNames[] = {
#define NK_KERNEL_DECL(ret, name, params) #name,
#include "ops/kernel_list.h"
};

inline constexpr std::string_view kCpuOnlyKernelNames[] = {
#define NK_KERNEL_DECL(ret, name, params) #name,
#include "ops/cpu/cpu_only_kernel_list.h"
};

}  // namespace nk::ops
