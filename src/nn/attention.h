// Causal self-attention: fused QKV projection, optional rotary embedding,
// flash-style grouped-query attention, output projection. For packed rows,
// cu_seqlens i32[B, S+1] keeps attention inside each document and positions
// i32[B, T] restart the rotary angle per document; both undefined otherwise.
//
// Tensor parallel (nn/tensor_parallel.h): qkv is column-parallel (this
// rank's share of the query heads and of the key/value heads, whole heads),
// proj row-parallel; n_head and n_kv_head are then this rank's counts. Under
// sequence parallelism x, y and dx are this rank's rows [N/t, C].
//
// Context parallel (nn/context_parallel.h): x, y and dx are this rank's
// local tokens (two chunks of the sequence), positions their global
// positions, and the attention is the ring's over every rank's keys.
//
// q/k norms (Qwen3): q_norm and k_norm, when their weights are defined, are
// RMSNorms over each head's D values of q and of k (weight [D], shared by
// the heads), applied after the projection and before the rotation. They
// work on the q and k columns of the fused QKV rows through column copies
// (ops::copy_columns, ops::add_columns), so every backend that has those
// runs them.
//
// Multi-head Latent Attention (DeepSeek-V2/V3; nn/latent_attention.h): when
// `mla` is active its projections make the fused qkv (n_kv_head = n_head,
// head_dim its nope + rope dims) and read the output in place of qkv, q/k
// norms and rope; the attention kernels and context parallelism are the
// same. Decode keeps the compressed latent in the KV cache, not the heads'
// keys and values (LatentAttention::cached_forward). Under tensor
// parallelism each rank holds whole heads' rows of q (or q_b) and kv_b and
// every rank the low-rank projections and norms, whose gradients are then
// partial sums over the ranks' heads.
#pragma once
#include "nn/context_parallel.h"
#include "nn/latent_attention.h"
#include "nn/linear.h"
#include "nn/norm.h"
#include "nn/tensor_parallel.h"

namespace nk::nn {

struct SelfAttention {
  Linear qkv, proj;
  int64_t n_head = 0, n_kv_head = 0, head_dim = 0;
  int64_t window = 0;   // sliding window (each token sees the last `window` positions); 0: all
  float scale = 0.f;    // the scores' factor; 0: 1/sqrt(head_dim)
  float softcap = 0.f;  // scores capped to softcap tanh(s / softcap) (Gemma 2); 0: none
  Tensor rope;          // f32 [maxT, D] table, or undefined (learned positions)
  TensorParallel tp;
  ContextParallel cp;
  Norm q_norm, k_norm;  // RMSNorms over each head's D values (weights undefined: none)
  LatentAttention mla;  // DeepSeek's MLA in place of qkv (inactive: none)

  // What the q/k norms keep: q and k before the norm and their inverse RMS.
  struct QkActs {
    Tensor q_raw, k_raw;    // [N, Hq D], [N, Hkv D]
    Tensor q_rstd, k_rstd;  // f32 [N Hq], [N Hkv]
    bool defined() const { return q_raw.defined(); }
  };
  bool qk_norm() const { return q_norm.w.defined(); }

  struct Saved {
    Tensor qkv;                               // [B, T, (Hq + 2 Hkv) D], q and k already rotated
    Tensor out;                               // [B, T, Hq D]
    Tensor lse;                               // f32 [B, Hq, T]
    AdapterActs qkv_adapters, proj_adapters;  // the adapters' (undefined without)
    Tensor full_x, full_y;      // sequence parallel: [B, T, C] scratch shared by every layer
    QkActs qk;                  // with q/k norms
    LatentAttention::Acts mla;  // with MLA
  };
  struct Scratch {
    Tensor dqkv, dout;           // shaped like Saved::qkv and Saved::out
    Tensor dqk;                  // with q/k norms: [B, T, Hq D]
    LatentAttention::Grads mla;  // with MLA
  };
  // QkActs for N rows; alloc(shape, dtype) allocates one tensor.
  template <typename Alloc>
  static QkActs qk_acts_for(int64_t N, int64_t Hq, int64_t Hkv, int64_t D, DType dt,
                            Alloc&& alloc) {
    return {alloc(Shape{N, Hq * D}, dt), alloc(Shape{N, Hkv * D}, dt),
            alloc(Shape{N * Hq}, DType::F32), alloc(Shape{N * Hkv}, DType::F32)};
  }

  // x [B, T, C] -> y [B, T, C]
  void forward(Tensor y, const Saved& s, const Tensor& x, const Tensor& cu_seqlens = Tensor(),
               const Tensor& positions = Tensor()) const {
    if (mla.active()) {
      // Under tp every rank runs the low-rank projections on every row and
      // its own heads after them (n_head: this rank's).
      const Tensor xf = tp.enter(x, s.full_x);
      mla.qkv_forward(s.qkv, s.mla, rows(xf), n_head, rope, positions, xf.dim(0), xf.dim(1));
      cp.attention_forward(s.out, s.lse, s.qkv, n_head, n_head, cu_seqlens, window, scale, softcap);
      mla.out_forward(rows(tp.exit_buffer(y, s.full_y)), s.mla, s.out, proj, n_head);
      tp.exit(y, s.full_y);
      return;
    }
    qkv.forward(s.qkv, tp.enter(x, s.full_x), s.qkv_adapters);
    if (qk_norm()) qk_norm_forward(rows(s.qkv), s.qk, rows(s.out));
    if (rope.defined() && positions.defined())
      ops::rope_inplace(s.qkv, n_head + n_kv_head, head_dim, rope, positions);
    else if (rope.defined())
      ops::rope_inplace(s.qkv, n_head + n_kv_head, head_dim, rope);
    cp.attention_forward(s.out, s.lse, s.qkv, n_head, n_kv_head, cu_seqlens, window, scale,
                         softcap);
    proj.forward(tp.exit_buffer(y, s.full_y), s.out, s.proj_adapters);
    tp.exit(y, s.full_y);
    proj.bottleneck_after_sum_forward(y, s.proj_adapters);
  }
  // Inference over a paged KV cache: x [N, C] new tokens of any sequences,
  // token n of block-table row seqs[n] at position positions[n] (i32 [1, N]
  // each; see ops::attention_cached for the cache and table layout). Rotates q
  // and k, stores k and v in the cache, then attends over it. qkv_buf
  // [N, (Hq+2Hkv)D] and out_buf [N, Hq D] are scratch; y [N, C]. ad: the
  // adapters' scratch (undefined without). MLA: k_cache (v_cache the same
  // tensor) is the latent cache [NB, 1, B, kv_rank + rope_dim]
  // (LatentAttention::cached_forward), ml and mc its scratch for >= N rows,
  // mla_kv_b kv_b's weight dense (undefined: kv_b.w).
  void forward_cached(Tensor y, Tensor qkv_buf, Tensor out_buf, const Tensor& x, Tensor k_cache,
                      Tensor v_cache, const Tensor& block_table, const Tensor& seqs,
                      const Tensor& positions, const AdapterActs& ad = {}, const QkActs& qk = {},
                      const LatentAttention::Acts& ml = {},
                      const LatentAttention::CacheActs& mc = {},
                      const Tensor& mla_kv_b = Tensor()) const {
    if (mla.active()) {
      NK_CHECK(ml.defined() && mc.defined(), "SelfAttention: MLA without its scratch");
      NK_CHECK(k_cache.raw() == v_cache.raw(),
               "SelfAttention: MLA's latent cache is one tensor for keys and values");
      mla.cached_forward(y, ml, mc, x, k_cache, mla_kv_b.defined() ? mla_kv_b : mla.kv_b.w, proj,
                         ad, n_head, rope, block_table, seqs, positions, window, scale, softcap);
      // Tensor parallel: this rank's heads (the latent rows, from the whole
      // low-rank projections, are every rank's), the projection's partial
      // sums added over the group.
      tp.whole_rows().exit(y, Tensor());
      return;
    }
    qkv.forward(qkv_buf, x, ad);
    if (qk_norm()) qk_norm_forward(qkv_buf, qk, out_buf);
    if (rope.defined())
      ops::rope_inplace(qkv_buf.view({1, qkv_buf.dim(0), qkv_buf.dim(1)}), n_head + n_kv_head,
                        head_dim, rope, positions);
    ops::kv_cache_store(k_cache, v_cache, qkv_buf, n_head, block_table, seqs, positions);
    ops::attention_cached(out_buf, qkv_buf, k_cache, v_cache, n_head, block_table, seqs, positions,
                          window, scale, softcap);
    // Tensor parallel: this rank's heads (n_head, n_kv_head, the cache's),
    // the projection's partial sums added over the group.
    proj.forward(y, out_buf, ad);
    tp.whole_rows().exit(y, Tensor());
    proj.bottleneck_after_sum_forward(y, ad);
  }
  // dx [B, T, C] written.
  void backward(Tensor dx, const Tensor& dy, const Saved& s, const Scratch& g, const Tensor& x,
                const Tensor& cu_seqlens = Tensor(), const Tensor& positions = Tensor()) const {
    if (mla.active()) {
      // Under tp dx (and the low-rank projections' and norms' gradients) are
      // this rank's heads' part: dx summed here, those by the trainer.
      mla.out_backward(g.dout, g.mla, rows(tp.exit_backward(dy, s.full_y)), s.mla, proj, n_head);
      cp.attention_backward(g.dqkv, g.dout, s.qkv, s.out, s.lse, n_head, n_head, cu_seqlens, window,
                            scale, softcap);
      const Tensor xf = tp.enter(x, s.full_x);
      mla.qkv_backward(rows(tp.enter_grad(dx, s.full_y)), g.dqkv, s.mla, g.mla, rows(xf), n_head,
                       rope, positions, xf.dim(0), xf.dim(1));
      tp.enter_backward(dx, s.full_y);
      return;
    }
    proj.backward(
        g.dout, tp.exit_backward(proj.bottleneck_after_sum_backward(dy, s.proj_adapters), s.full_y),
        s.out, s.proj_adapters);
    cp.attention_backward(g.dqkv, g.dout, s.qkv, s.out, s.lse, n_head, n_kv_head, cu_seqlens,
                          window, scale, softcap);
    if (rope.defined() && positions.defined())
      ops::rope_inplace(g.dqkv, n_head + n_kv_head, head_dim, rope, positions, /*inverse=*/true);
    else if (rope.defined())
      ops::rope_inplace(g.dqkv, n_head + n_kv_head, head_dim, rope, 0, /*inverse=*/true);
    if (qk_norm()) qk_norm_backward(rows(g.dqkv), s.qk, rows(g.dout), rows(g.dqk));
    qkv.backward(tp.enter_grad(dx, s.full_y), g.dqkv, tp.enter(x, s.full_x), s.qkv_adapters);
    tp.enter_backward(dx, s.full_y);
  }

 private:
  // The first N n values of contiguous t as [N n / D, D]: N rows of n
  // values, one head of D values per row of the result.
  static Tensor heads(const Tensor& t, int64_t N, int64_t n, int64_t D) {
    return t.view({-1}).narrow0(0, N * n).view({N * n / D, D});
  }
  // The q and k columns of qkv2 [N, (Hq + 2 Hkv) D] normalised in place;
  // scratch [N, >= Hq D] (the attention output, not yet written).
  void qk_norm_forward(const Tensor& qkv2, const QkActs& a, const Tensor& scratch) const {
    NK_CHECK(a.defined(), "SelfAttention: q/k norms without their activations");
    const int64_t N = qkv2.dim(0), D = head_dim;
    for (int p = 0; p < 2; ++p) {
      const Norm& norm = p == 0 ? q_norm : k_norm;
      const int64_t n = (p == 0 ? n_head : n_kv_head) * D, col0 = p == 0 ? 0 : n_head * D;
      const Tensor raw = (p == 0 ? a.q_raw : a.k_raw).narrow0(0, N);
      const Tensor rstd = (p == 0 ? a.q_rstd : a.k_rstd).narrow0(0, N * n / D);
      ops::copy_columns(raw, qkv2, col0, 1.f);
      norm.forward(heads(scratch, N, n, D), Tensor(), rstd, heads(raw, N, n, D));
      // The columns set to the normalised values: x - x is exactly 0.
      ops::add_columns(qkv2, raw, col0, -1.f);
      ops::add_columns(qkv2, heads(scratch, N, n, D).view({N, n}), col0, 1.f);
    }
  }
  // dqkv2's q and k columns, d loss / d normalised values, made d loss / d
  // raw values; the norms' weight gradients accumulate. scratch, dqk [N, >= Hq D].
  void qk_norm_backward(const Tensor& dqkv2, const QkActs& a, const Tensor& scratch,
                        const Tensor& dqk) const {
    const int64_t N = dqkv2.dim(0), D = head_dim;
    for (int p = 0; p < 2; ++p) {
      const Norm& norm = p == 0 ? q_norm : k_norm;
      const int64_t n = (p == 0 ? n_head : n_kv_head) * D, col0 = p == 0 ? 0 : n_head * D;
      const Tensor raw = (p == 0 ? a.q_raw : a.k_raw).narrow0(0, N);
      const Tensor rstd = (p == 0 ? a.q_rstd : a.k_rstd).narrow0(0, N * n / D);
      const Tensor dy = heads(scratch, N, n, D), dx = heads(dqk, N, n, D);
      ops::copy_columns(dy.view({N, n}), dqkv2, col0, 1.f);
      ops::fill(dx, 0.f);  // rmsnorm_backward accumulates into dx
      norm.backward(dx, dy, heads(raw, N, n, D), Tensor(), rstd);
      ops::add_columns(dqkv2, dy.view({N, n}), col0, -1.f);
      ops::add_columns(dqkv2, dx.view({N, n}), col0, 1.f);
    }
  }
};

}  // namespace nk::nn
