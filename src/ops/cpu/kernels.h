// The CPU backend's kernels, one per public op of ops.h and under the same
// name, called by the op fronts (src/ops/<family>.cc) through NK_KERNEL after
// the shapes, dtypes and devices are checked there. Semantics and layouts are
// those documented in ops.h; a kernel checks only what it reads from tensor
// memory (token ids, targets, positions, slots, cu_seqlens), which the front
// cannot see. The list is ops/kernel_list.h, shared with the CUDA backend
// (ops/cuda/kernels.h); the NF4 and block-quantised kernels below are the
// CPU's alone.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace nk::ops {
struct AdamWParams;
struct Nf4Weight;
struct QuantWeight;
}  // namespace nk::ops

namespace nk::ops::cpu {

#include "ops/kernel_list.h"

// ---- NF4 (nf4.cc) ----
void nf4_quantize(Nf4Weight& q, const Tensor& w);
void nf4_dequantize(Tensor out, const Nf4Weight& q, int64_t start);
void nf4_linear_forward(Tensor y, const Tensor& x, const Nf4Weight& w, const Tensor& b);
void nf4_linear_backward_input(Tensor dx, const Tensor& dy, const Nf4Weight& w);
void nf4_embedding_forward(Tensor out, const Tensor& tokens, const Nf4Weight& wte,
                           const Tensor& wpe, const Tensor& positions);

// ---- quantised weights (quant.cc, quant_linear.cc, quant_dot.cc) ----
void quant_quantize(QuantWeight& q, const Tensor& w);
void quant_dequantize(Tensor out, const QuantWeight& q, int64_t row0);
void quant_linear_forward(Tensor y, const Tensor& x, const QuantWeight& w, const Tensor& b);
void quant_embedding_forward(Tensor out, const Tensor& tokens, const QuantWeight& wte);
// ops/quant.h's quant_pack, in place (true when packed); quant_unpack: rows
// (q's shape, row layout) <- a packed q's bytes and scale.
bool quant_pack(QuantWeight& q);
void quant_unpack(QuantWeight& rows, const QuantWeight& q);

// ---- rotary table (rope.cc); the table is built in host memory only ----
// Fills table f32[maxT, D].
void rope_table(Tensor table, double theta);

}  // namespace nk::ops::cpu
