// The CPU backend's kernels that no other backend has, an X-macro list like
// ops/kernel_list.h (one NK_KERNEL_DECL(return type, name, (parameters)) line
// per kernel; the includer defines the macro, the list undefines it): their
// fronts pick the CPU kernel alone (pick_kernel with no CUDA kernel), so a
// tensor on another device gets "no kernel for device". ops/cpu/kernels.h
// declares them in nk::ops::cpu; ops/kernel_names.h's kCpuOnlyKernelNames
// lists them for tests/ops/kernel_coverage_test.cc, which requires a test
// case of each on the CPU. Includes nothing; no include guard.
#ifndef NK_KERNEL_DECL
#error "define NK_KERNEL_DECL(ret, name, params) before including ops/cpu/cpu_only_kernel_list.h"
#endif

// (clang-format would read `Nf4Weight& q` in a macro argument as a product.)
// clang-format off
// ---- NF4 (nf4.cc) ----
NK_KERNEL_DECL(void, nf4_quantize, (Nf4Weight& q, const Tensor& w))
NK_KERNEL_DECL(void, nf4_dequantize, (Tensor out, const Nf4Weight& q, int64_t start))
NK_KERNEL_DECL(void, nf4_linear_forward,
               (Tensor y, const Tensor& x, const Nf4Weight& w, const Tensor& b))
NK_KERNEL_DECL(void, nf4_linear_backward_input, (Tensor dx, const Tensor& dy, const Nf4Weight& w))
NK_KERNEL_DECL(void, nf4_embedding_forward,
               (Tensor out, const Tensor& tokens, const Nf4Weight& wte, const Tensor& wpe,
                const Tensor& positions, int64_t vocab_start))

// ---- quantised weights (quant.cc, quant_linear.cc, quant_dot.cc) ----
NK_KERNEL_DECL(void, quant_quantize, (QuantWeight& q, const Tensor& w))
NK_KERNEL_DECL(void, quant_dequantize, (Tensor out, const QuantWeight& q, int64_t row0))
NK_KERNEL_DECL(void, quant_linear_forward,
               (Tensor y, const Tensor& x, const QuantWeight& w, const Tensor& b))
NK_KERNEL_DECL(void, quant_embedding_forward,
               (Tensor out, const Tensor& tokens, const QuantWeight& wte, int64_t vocab_start))
// ops/quant.h's quant_pack, in place (true when packed); quant_unpack: rows
// (q's shape, row layout) <- a packed q's bytes and scale.
NK_KERNEL_DECL(bool, quant_pack, (QuantWeight& q))
NK_KERNEL_DECL(void, quant_unpack, (QuantWeight& rows, const QuantWeight& q))

// ---- attention of queries to one key/value block (attention_block.cc) ----
NK_KERNEL_DECL(void, attention_block_forward,
               (Tensor out, Tensor lse, const Tensor& qkv, const Tensor& kv, const Tensor& qpos,
                const Tensor& kpos, int64_t n_q_heads, int64_t n_kv_heads, int64_t window,
                const Tensor& qstart, float scale, float softcap))
NK_KERNEL_DECL(void, attention_block_backward,
               (Tensor dq, Tensor dkv, const Tensor& dout, const Tensor& out, const Tensor& lse,
                const Tensor& qkv, const Tensor& kv, const Tensor& qpos, const Tensor& kpos,
                int64_t n_q_heads, int64_t n_kv_heads, int64_t window, const Tensor& qstart,
                float scale, float softcap))

// ---- Gemma's gated GELU and soft-capping (activation.cc) ----
NK_KERNEL_DECL(void, geglu_forward, (Tensor y, const Tensor& gu))
NK_KERNEL_DECL(void, geglu_backward, (Tensor dgu, const Tensor& dy, const Tensor& gu))
NK_KERNEL_DECL(void, softcap_forward, (Tensor y, const Tensor& x, float cap))
NK_KERNEL_DECL(void, softcap_backward, (Tensor dx, const Tensor& dy, const Tensor& y, float cap))

// ---- rotary table (rope.cc); the table is built in host memory only ----
// Fills table f32[maxT, D].
NK_KERNEL_DECL(void, rope_table, (Tensor table, double theta))
// clang-format on

#undef NK_KERNEL_DECL
