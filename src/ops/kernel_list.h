// The kernel list every backend implements, one kernel per public op of
// ops.h under the same name (semantics and layouts are ops.h's), written as
// an X-macro list: one NK_KERNEL_DECL(return type, name, (parameters)) line
// per kernel. Whoever includes it defines NK_KERNEL_DECL first; the list
// undefines it at its end. It expands twice over:
//  - as declarations (`ret name params;`) inside each backend's namespace, by
//    its kernels.h (ops/cpu/kernels.h, ops/cuda/kernels.h), so the backends
//    cannot drift apart: a front calling a kernel one backend lacks does not
//    link;
//  - as data (`#name,`): ops/kernel_names.h's kKernelNames, which
//    tests/ops/kernel_coverage_test.cc walks to prove that every kernel here
//    has a test case on every backend (a new line needs its NK_COVERS case).
// It includes nothing itself (core/tensor.h and the forward declarations come
// first). No include guard: each expansion includes it once.
#ifndef NK_KERNEL_DECL
#error "define NK_KERNEL_DECL(ret, name, params) before including ops/kernel_list.h"
#endif

// ---- copies and conversions ----
NK_KERNEL_DECL(void, convert, (Tensor dst, const Tensor& src))
NK_KERNEL_DECL(void, fill, (Tensor dst, float value))
NK_KERNEL_DECL(void, copy_to_host, (const Tensor& src, float* dst))
NK_KERNEL_DECL(void, copy_from_host, (Tensor dst, const float* src))
NK_KERNEL_DECL(void, accumulate, (Tensor dst, const Tensor& src))
NK_KERNEL_DECL(void, add, (Tensor y, const Tensor& a, const Tensor& b))
NK_KERNEL_DECL(double, sum_squares, (const Tensor& x))
NK_KERNEL_DECL(void, scale, (Tensor x, float s))
NK_KERNEL_DECL(int64_t, count_nonfinite, (const Tensor& x))
NK_KERNEL_DECL(void, add_columns, (Tensor y, const Tensor& z, int64_t col0, float s))
NK_KERNEL_DECL(void, copy_columns, (Tensor z, const Tensor& y, int64_t col0, float s))
NK_KERNEL_DECL(void, dropout, (Tensor y, const Tensor& x, float p, uint64_t seed))
NK_KERNEL_DECL(void, scale_columns, (Tensor y, const Tensor& l, int64_t col0))
NK_KERNEL_DECL(void, scale_rows, (Tensor y, const Tensor& s))
NK_KERNEL_DECL(void, column_dot, (Tensor dl, const Tensor& a, int64_t col0, const Tensor& b))
NK_KERNEL_DECL(void, copy_bytes_from_host, (Tensor dst, const void* src))
NK_KERNEL_DECL(void, copy_bytes_to_host, (const Tensor& src, void* dst))
NK_KERNEL_DECL(int64_t, count_not_equal, (const Tensor& x, int64_t value))
NK_KERNEL_DECL(void, synchronize, ())

// ---- embeddings; dwte or dwpe undefined: not computed ----
NK_KERNEL_DECL(void, embedding_forward,
               (Tensor out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                const Tensor& positions, int64_t vocab_start))
NK_KERNEL_DECL(void, embedding_backward,
               (Tensor dwte, Tensor dwpe, const Tensor& dout, const Tensor& tokens,
                const Tensor& positions, int64_t vocab_start))

// ---- normalisation; dw or db undefined: not computed ----
NK_KERNEL_DECL(void, layernorm_forward,
               (Tensor y, Tensor mean, Tensor rstd, const Tensor& x, const Tensor& w,
                const Tensor& b, float eps))
NK_KERNEL_DECL(void, layernorm_backward,
               (Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x, const Tensor& w,
                const Tensor& mean, const Tensor& rstd))
NK_KERNEL_DECL(void, rmsnorm_forward,
               (Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps, float w_offset))
NK_KERNEL_DECL(void, rmsnorm_backward,
               (Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                const Tensor& rstd, float w_offset))

// ---- linear; dx, dw or db undefined: not computed ----
NK_KERNEL_DECL(void, linear_forward, (Tensor y, const Tensor& x, const Tensor& w, const Tensor& b))
NK_KERNEL_DECL(void, linear_backward,
               (Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x,
                const Tensor& w))

// ---- activations ----
NK_KERNEL_DECL(void, gelu_forward, (Tensor y, const Tensor& x))
NK_KERNEL_DECL(void, gelu_backward, (Tensor dx, const Tensor& dy, const Tensor& x))
NK_KERNEL_DECL(void, silu_forward, (Tensor y, const Tensor& x))
NK_KERNEL_DECL(void, silu_backward, (Tensor dx, const Tensor& dy, const Tensor& x))
NK_KERNEL_DECL(void, relu_forward, (Tensor y, const Tensor& x))
NK_KERNEL_DECL(void, relu_backward, (Tensor dx, const Tensor& dy, const Tensor& x))
NK_KERNEL_DECL(void, swiglu_forward, (Tensor y, const Tensor& gu))
NK_KERNEL_DECL(void, swiglu_backward, (Tensor dgu, const Tensor& dy, const Tensor& gu))

// ---- rotary embedding ----
// Both ops::rope_inplace overloads: positions i32[B,T] when defined, else pos0 + t;
// the table's width R <= head_dim values of each head rotate (partial rotary).
NK_KERNEL_DECL(void, rope_inplace,
               (Tensor x, int64_t n_heads, int64_t head_dim, const Tensor& table, int64_t pos0,
                const Tensor& positions, bool inverse))

// ---- attention ----
NK_KERNEL_DECL(void, attention_forward,
               (Tensor out, Tensor lse, const Tensor& qkv, int64_t n_q_heads, int64_t n_kv_heads,
                const Tensor& cu_seqlens, int64_t window, float scale, float softcap))
NK_KERNEL_DECL(void, attention_backward,
               (Tensor dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                const Tensor& lse, int64_t n_q_heads, int64_t n_kv_heads, const Tensor& cu_seqlens,
                int64_t window, float scale, float softcap))
NK_KERNEL_DECL(void, kv_cache_store,
               (Tensor k_cache, Tensor v_cache, const Tensor& qkv, int64_t n_q_heads,
                const Tensor& block_table, const Tensor& seqs, const Tensor& positions))
NK_KERNEL_DECL(void, attention_cached,
               (Tensor out, const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                int64_t n_q_heads, const Tensor& block_table, const Tensor& seqs,
                const Tensor& positions, int64_t window, float scale, float softcap))

// ---- softmax cross-entropy ----
NK_KERNEL_DECL(void, cross_entropy_forward,
               (Tensor losses, const Tensor& logits, const Tensor& targets, int64_t ignore_index))
NK_KERNEL_DECL(void, cross_entropy_forward_backward,
               (Tensor losses, Tensor dlogits, const Tensor& logits, const Tensor& targets,
                int64_t ignore_index, float grad_scale))

// ---- vocabulary-parallel cross-entropy ----
NK_KERNEL_DECL(void, cross_entropy_shard_stats,
               (Tensor row_max, Tensor sumexp, Tensor target_logit, const Tensor& logits,
                const Tensor& targets, int64_t vocab_start))
NK_KERNEL_DECL(void, cross_entropy_rescale_stats,
               (Tensor row_max, Tensor sumexp, const Tensor& global_max))
NK_KERNEL_DECL(void, cross_entropy_shard_finish,
               (Tensor losses, Tensor lse, const Tensor& row_max, const Tensor& sumexp,
                const Tensor& target_logit, const Tensor& targets, int64_t ignore_index))
NK_KERNEL_DECL(void, cross_entropy_shard_backward,
               (Tensor dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                int64_t vocab_start, int64_t ignore_index, float grad_scale))

// ---- optimizer ----
NK_KERNEL_DECL(void, adamw_step,
               (Tensor param, const Tensor& grad, Tensor m, Tensor v, const AdamWParams& p,
                Tensor param_copy))
NK_KERNEL_DECL(void, adamw_step_mixed,
               (Tensor master, Tensor remainder, const Tensor& grad, Tensor m, Tensor v,
                Tensor scales, const AdamWParams& p, Tensor param_copy))
NK_KERNEL_DECL(void, bf16_master_split, (Tensor hi, Tensor remainder, const Tensor& f32))
NK_KERNEL_DECL(void, bf16_master_join, (Tensor f32, const Tensor& hi, const Tensor& remainder))

// ---- Mixture of Experts (ops/moe.h, moe.cc) ----
NK_KERNEL_DECL(void, moe_route,
               (Tensor probs, Tensor idx, Tensor weights, Tensor stats, const Tensor& logits,
                const Tensor& bias, const MoeRouteSpec& spec))
NK_KERNEL_DECL(void, moe_route_backward,
               (Tensor dlogits, const Tensor& dweights, const Tensor& balance_grad, float z_grad,
                const Tensor& logits, const Tensor& probs, const Tensor& idx,
                const MoeRouteSpec& spec))
NK_KERNEL_DECL(void, moe_gather, (Tensor xs, const Tensor& x, const Tensor& src))
NK_KERNEL_DECL(void, moe_combine,
               (Tensor y, const Tensor& out, const Tensor& slot, const Tensor& weights))
NK_KERNEL_DECL(void, moe_combine_backward,
               (Tensor dout, Tensor dweights, const Tensor& dy, const Tensor& out,
                const Tensor& slot, const Tensor& weights))
NK_KERNEL_DECL(void, moe_scatter, (Tensor dx, const Tensor& dxs, const Tensor& slot))

#undef NK_KERNEL_DECL
