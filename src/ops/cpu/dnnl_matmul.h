// A small wrapper over oneDNN's matmul: row-major C[M,N] (+)= op(A)[M,K] @ op(B)[K,N]
// (+ bias[N]). Transposed operands are described by memory descs (format tag
// `ba`), never copied. Primitives are created once per distinct MatmulSpec and
// cached process-wide, the 1024 most recently used (oneDNN's own default),
// so after the first training step none are created, and shapes that change
// every call (a MoE layer's experts' rows, prompts) do not grow memory.
// Compiled once, for the baseline: oneDNN picks its own kernels at run time
// (capped with the CPU kernels' level, ops/cpu_isa.h); each per-level copy of
// the CPU kernels calls this one.
// On a CPU where oneDNN has no bf16 matmul (before AVX-512) a bf16 product runs
// as f32 on converted copies, rounded back (see Entry in the .cc).
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "ops/cpu/level.h"

namespace nk::ops::cpu {

struct MatmulSpec {
  int64_t m = 0, n = 0, k = 0;
  DType a = DType::F32, b = DType::F32, c = DType::F32;
  bool trans_a = false;  // A stored as [K,M] row-major
  bool trans_b = false;  // B stored as [N,K] row-major
  // A's row stride in elements (of [M,K], or [K,M] with trans_a); 0: dense
  // (K, or M). dnnl_matmul sets it where it runs a product in two (below).
  int64_t lda = 0;
  bool accumulate = false;  // C += A@B (oneDNN sum post-op) instead of C = A@B
  bool has_bias = false;
  DType bias = DType::F32;  // only read when has_bias
};

// All pointers are row-major buffers of the spec's dtypes, dense but for A's
// rows (lda); bias may be null iff !spec.has_bias. A product of many rows (M)
// that are not a multiple of 64 runs as two, the rows up to a multiple of 64
// and the rest: oneDNN's blocking runs such an M far below its rate (GPT-2's
// head gradient, M = 50257: 368 GFLOP/s in bf16 against 560 at 50240 on a
// Zen 5, and 308 against 339 in f32). Not safe to run concurrently with the same spec (oneDNN's
// per-primitive scratchpad); the training loop calls it from one thread.
void dnnl_matmul(const MatmulSpec& spec, const void* a, const void* b, void* c,
                 const void* bias = nullptr);

// Number of cached primitives (tests check that repeated calls add none).
size_t dnnl_matmul_cache_size();
// Tests: at most n primitives kept (the least recently used dropped first);
// returns the capacity it replaces.
size_t dnnl_matmul_set_cache_capacity(size_t n);

// Tests: while on, 16-bit products take the f32 fallback even where oneDNN has
// them, so the fallback is checked on every CPU. Products made while it is on
// are cached apart from the others.
void dnnl_matmul_force_fallback(bool on);

}  // namespace nk::ops::cpu

// The per-level copies of the kernels (ops/cpu/level.h) call the one wrapper.
namespace nk::ops::NK_CPU_NS {
using cpu::dnnl_matmul;
using cpu::MatmulSpec;
}  // namespace nk::ops::NK_CPU_NS
