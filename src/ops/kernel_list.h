// The kernel list every backend implements, one kernel per public op of
// ops.h under the same name (semantics and layouts are ops.h's). Included
// inside each backend's namespace by its kernels.h (ops/cpu/kernels.h,
// ops/cuda/kernels.h), so the backends cannot drift apart; it includes
// nothing itself (core/tensor.h and the forward declarations come first).
// No include guard: each backend's namespace includes it once.

// ---- copies and conversions ----
void convert(Tensor dst, const Tensor& src);
void fill(Tensor dst, float value);
void copy_to_host(const Tensor& src, float* dst);
void copy_from_host(Tensor dst, const float* src);
void accumulate(Tensor dst, const Tensor& src);
void add(Tensor y, const Tensor& a, const Tensor& b);
double sum_squares(const Tensor& x);
void scale(Tensor x, float s);
int64_t count_nonfinite(const Tensor& x);
void add_columns(Tensor y, const Tensor& z, int64_t col0, float s);
void copy_columns(Tensor z, const Tensor& y, int64_t col0, float s);
void dropout(Tensor y, const Tensor& x, float p, uint64_t seed);
void scale_columns(Tensor y, const Tensor& l, int64_t col0);
void column_dot(Tensor dl, const Tensor& a, int64_t col0, const Tensor& b);
void copy_bytes_from_host(Tensor dst, const void* src);
void copy_bytes_to_host(const Tensor& src, void* dst);
int64_t count_not_equal(const Tensor& x, int64_t value);
void synchronize();

// ---- embeddings; dwte or dwpe undefined: not computed ----
void embedding_forward(Tensor out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       const Tensor& positions, int64_t vocab_start);
void embedding_backward(Tensor dwte, Tensor dwpe, const Tensor& dout, const Tensor& tokens,
                        const Tensor& positions, int64_t vocab_start);

// ---- normalisation; dw or db undefined: not computed ----
void layernorm_forward(Tensor y, Tensor mean, Tensor rstd, const Tensor& x, const Tensor& w,
                       const Tensor& b, float eps);
void layernorm_backward(Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x,
                        const Tensor& w, const Tensor& mean, const Tensor& rstd);
void rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps);
void rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd);

// ---- linear; dx, dw or db undefined: not computed ----
void linear_forward(Tensor y, const Tensor& x, const Tensor& w, const Tensor& b);
void linear_backward(Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x,
                     const Tensor& w);

// ---- activations ----
void gelu_forward(Tensor y, const Tensor& x);
void gelu_backward(Tensor dx, const Tensor& dy, const Tensor& x);
void silu_forward(Tensor y, const Tensor& x);
void silu_backward(Tensor dx, const Tensor& dy, const Tensor& x);
void relu_forward(Tensor y, const Tensor& x);
void relu_backward(Tensor dx, const Tensor& dy, const Tensor& x);
void swiglu_forward(Tensor y, const Tensor& gu);
void swiglu_backward(Tensor dgu, const Tensor& dy, const Tensor& gu);

// ---- rotary embedding ----
// Both ops::rope_inplace overloads: positions i32[B,T] when defined, else pos0 + t.
void rope_inplace(Tensor x, int64_t n_heads, int64_t head_dim, const Tensor& table, int64_t pos0,
                  const Tensor& positions, bool inverse);

// ---- attention ----
void attention_forward(Tensor out, Tensor lse, const Tensor& qkv, int64_t n_q_heads,
                       int64_t n_kv_heads, const Tensor& cu_seqlens, int64_t window);
void attention_backward(Tensor dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, int64_t n_q_heads, int64_t n_kv_heads,
                        const Tensor& cu_seqlens, int64_t window);
void kv_cache_store(Tensor k_cache, Tensor v_cache, const Tensor& qkv, int64_t n_q_heads,
                    const Tensor& block_table, const Tensor& seqs, const Tensor& positions);
void attention_cached(Tensor out, const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                      int64_t n_q_heads, const Tensor& block_table, const Tensor& seqs,
                      const Tensor& positions, int64_t window);

// ---- softmax cross-entropy ----
void cross_entropy_forward(Tensor losses, const Tensor& logits, const Tensor& targets,
                           int64_t ignore_index);
void cross_entropy_forward_backward(Tensor losses, Tensor dlogits, const Tensor& logits,
                                    const Tensor& targets, int64_t ignore_index, float grad_scale);

// ---- vocabulary-parallel cross-entropy ----
void cross_entropy_shard_stats(Tensor row_max, Tensor sumexp, Tensor target_logit,
                               const Tensor& logits, const Tensor& targets, int64_t vocab_start);
void cross_entropy_rescale_stats(Tensor row_max, Tensor sumexp, const Tensor& global_max);
void cross_entropy_shard_finish(Tensor losses, Tensor lse, const Tensor& row_max,
                                const Tensor& sumexp, const Tensor& target_logit,
                                const Tensor& targets, int64_t ignore_index);
void cross_entropy_shard_backward(Tensor dlogits, const Tensor& logits, const Tensor& targets,
                                  const Tensor& lse, int64_t vocab_start, int64_t ignore_index,
                                  float grad_scale);

// ---- optimizer ----
void adamw_step(Tensor param, const Tensor& grad, Tensor m, Tensor v, const AdamWParams& p,
                Tensor param_copy);
void adamw_step_mixed(Tensor master, Tensor remainder, const Tensor& grad, Tensor m, Tensor v,
                      Tensor scales, const AdamWParams& p, Tensor param_copy);
void bf16_master_split(Tensor hi, Tensor remainder, const Tensor& f32);
void bf16_master_join(Tensor f32, const Tensor& hi, const Tensor& remainder);
