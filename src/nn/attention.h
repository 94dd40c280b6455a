// Causal self-attention: fused QKV projection, optional rotary embedding,
// flash-style grouped-query attention, output projection. For packed rows,
// cu_seqlens i32[B, S+1] keeps attention inside each document and positions
// i32[B, T] restart the rotary angle per document; both undefined otherwise.
//
// Tensor parallel (nn/tensor_parallel.h): qkv is column-parallel (this
// rank's share of the query heads and of the key/value heads, whole heads),
// proj row-parallel; n_head and n_kv_head are then this rank's counts. Under
// sequence parallelism x, y and dx are this rank's rows [N/t, C].
#pragma once
#include "nn/linear.h"
#include "nn/tensor_parallel.h"

namespace nk::nn {

struct SelfAttention {
  Linear qkv, proj;
  int64_t n_head = 0, n_kv_head = 0, head_dim = 0;
  int64_t window = 0;  // sliding window (each token sees the last `window` positions); 0: all
  Tensor rope;         // f32 [maxT, D] table, or undefined (learned positions)
  TensorParallel tp;

  struct Saved {
    Tensor qkv;                               // [B, T, (Hq + 2 Hkv) D], q and k already rotated
    Tensor out;                               // [B, T, Hq D]
    Tensor lse;                               // f32 [B, Hq, T]
    AdapterActs qkv_adapters, proj_adapters;  // the adapters' (undefined without)
    Tensor full_x, full_y;  // sequence parallel: [B, T, C] scratch shared by every layer
  };
  struct Scratch {
    Tensor dqkv, dout;  // shaped like Saved::qkv and Saved::out
  };

  // x [B, T, C] -> y [B, T, C]
  void forward(Tensor y, const Saved& s, const Tensor& x, const Tensor& cu_seqlens = Tensor(),
               const Tensor& positions = Tensor()) const {
    qkv.forward(s.qkv, tp.enter(x, s.full_x), s.qkv_adapters);
    if (rope.defined() && positions.defined())
      ops::rope_inplace(s.qkv, n_head + n_kv_head, head_dim, rope, positions);
    else if (rope.defined())
      ops::rope_inplace(s.qkv, n_head + n_kv_head, head_dim, rope);
    ops::attention_forward(s.out, s.lse, s.qkv, n_head, n_kv_head, cu_seqlens, window);
    proj.forward(tp.exit_buffer(y, s.full_y), s.out, s.proj_adapters);
    tp.exit(y, s.full_y);
  }
  // Inference over a paged KV cache: x [N, C] new tokens of any sequences,
  // token n of block-table row seqs[n] at position positions[n] (i32 [1, N]
  // each; see ops::attention_cached for the cache and table layout). Rotates q
  // and k, stores k and v in the cache, then attends over it. qkv_buf
  // [N, (Hq+2Hkv)D] and out_buf [N, Hq D] are scratch; y [N, C]. ad: the
  // adapters' scratch (undefined without).
  void forward_cached(Tensor y, Tensor qkv_buf, Tensor out_buf, const Tensor& x, Tensor k_cache,
                      Tensor v_cache, const Tensor& block_table, const Tensor& seqs,
                      const Tensor& positions, const AdapterActs& ad = {}) const {
    qkv.forward(qkv_buf, x, ad);
    if (rope.defined())
      ops::rope_inplace(qkv_buf.view({1, qkv_buf.dim(0), qkv_buf.dim(1)}), n_head + n_kv_head,
                        head_dim, rope, positions);
    ops::kv_cache_store(k_cache, v_cache, qkv_buf, n_head, block_table, seqs, positions);
    ops::attention_cached(out_buf, qkv_buf, k_cache, v_cache, n_head, block_table, seqs, positions,
                          window);
    proj.forward(y, out_buf, ad);
  }
  // dx [B, T, C] written.
  void backward(Tensor dx, const Tensor& dy, const Saved& s, const Scratch& g, const Tensor& x,
                const Tensor& cu_seqlens = Tensor(), const Tensor& positions = Tensor()) const {
    proj.backward(g.dout, tp.exit_backward(dy, s.full_y), s.out, s.proj_adapters);
    ops::attention_backward(g.dqkv, g.dout, s.qkv, s.out, s.lse, n_head, n_kv_head, cu_seqlens,
                            window);
    if (rope.defined() && positions.defined())
      ops::rope_inplace(g.dqkv, n_head + n_kv_head, head_dim, rope, positions, /*inverse=*/true);
    else if (rope.defined())
      ops::rope_inplace(g.dqkv, n_head + n_kv_head, head_dim, rope, 0, /*inverse=*/true);
    qkv.backward(tp.enter_grad(dx, s.full_y), g.dqkv, tp.enter(x, s.full_x), s.qkv_adapters);
    tp.enter_backward(dx, s.full_y);
  }
};

}  // namespace nk::nn
