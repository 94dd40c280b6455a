// Which copy of the CPU kernels a translation unit belongs to. The build
// compiles src/ops/cpu/*.cc (but dnnl_matmul.cc) once per ISA level of
// ops/cpu_isa.h, each copy with -DNK_CPU_LEVEL=<level> and that level's
// -march (CMakeLists.txt, nk_cpu_levels), so each copy lives in its own
// namespace nk::ops::cpu_<level>: the inline helpers of these headers never
// merge across levels at link time, and a kernel calls its own level's
// helpers. Outside the copies (tests and benches that include a helper
// header) the baseline level, avx2, which runs on every CPU the build does.
#pragma once

#ifndef NK_CPU_LEVEL
#define NK_CPU_LEVEL avx2
#endif
#define NK_CPU_CAT2_(a, b) a##b
#define NK_CPU_CAT_(a, b) NK_CPU_CAT2_(a, b)
// The namespace of this copy's kernels: cpu_avx2, cpu_avx512, cpu_avx512_bf16.
#define NK_CPU_NS NK_CPU_CAT_(cpu_, NK_CPU_LEVEL)
