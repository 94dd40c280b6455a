// The three paths of the CPU's quant_linear_forward, reachable apart for the
// tests that check each against the references and for bench_quant's
// --sweep: one table per ISA level like ops/cpu_kernels.h (filled by each
// level's ops/cpu/kernel_table.cc), since which paths a level has differs
// (the byte-tile GEMM needs AVX-512 VNNI). Semantics: ops/cpu/quant_blocks.h.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "ops/cpu_isa.h"
#include "ops/quant.h"

namespace nk::ops {

// The path quant_linear_forward takes (ops/cpu/quant_blocks.h).
enum class QuantPath { Direct, Gemm, Panels };

struct CpuQuantPaths {
  using Linear = void (*)(Tensor y, const Tensor& x, const QuantWeight& w, const Tensor& b);
  Linear direct = nullptr, panels = nullptr, gemm = nullptr;
  bool (*gemm_available)(QuantType t, int64_t in) = nullptr;
  QuantPath (*path)(QuantType t, int64_t in, int64_t n, QuantLayout layout) = nullptr;
};

const CpuQuantPaths& cpu_quant_paths_avx2();
const CpuQuantPaths& cpu_quant_paths_avx512();
const CpuQuantPaths& cpu_quant_paths_avx512_bf16();
// The active level's (ops/cpu_isa.h).
const CpuQuantPaths& cpu_quant_paths();

}  // namespace nk::ops
