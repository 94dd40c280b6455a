// The tensor-core path of ops/cuda/attention.cu (flash_attention.cu): causal
// grouped-query attention over bf16 qkv with FlashAttention-2's tiling, bf16
// operands on mma.sync with fp32 accumulation. Internal to the CUDA backend:
// attention_forward / attention_backward call it for the shapes it supports,
// after validating cu_seqlens and expanding it, with the window, into each
// token's first visible key (attention.cu's first_keys).
#pragma once
#include <cstdint>
#include <initializer_list>

#include "core/tensor.h"

namespace nk::ops::cuda {

// Whether the flash path handles a call: bf16, a head dim of 32, 64 or 128,
// and every tensor's data 16-byte aligned (the tiles are copied 16 bytes at a
// time).
bool flash_attention_supported(DType dtype, int64_t head_dim,
                               std::initializer_list<const Tensor*> tensors);

// Layouts as ops::attention_forward / attention_backward: qkv bf16[B,T,(Hq+2*Hkv)*D],
// out bf16[B,T,Hq*D], lse f32[B,Hq,T], dqkv like qkv. starts: i32[B,T], token
// t's first visible key (nondecreasing in t), or undefined for plain causal
// attention (every token sees keys 0..t). B*T > 0.
void flash_attention_forward(Tensor out, Tensor lse, const Tensor& qkv, int64_t n_q_heads,
                             int64_t n_kv_heads, const Tensor& starts);
void flash_attention_backward(Tensor dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                              const Tensor& lse, int64_t n_q_heads, int64_t n_kv_heads,
                              const Tensor& starts);

}  // namespace nk::ops::cuda
