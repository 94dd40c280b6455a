// Multi-head Latent Attention (DeepSeek-V2 / V3): queries through a
// low-rank bottleneck (q_a, an RMSNorm, q_b; or one projection q when there
// is no q rank), keys and values from a compressed latent: kv_a projects x to
// [latent (kv_rank) | a rotary key shared by every head (rope_dim)], the
// latent goes through an RMSNorm and kv_b to each head's [k_nope (nope) |
// v (v_dim)]. Each head's query and key are [nope | rope_dim] values, only
// the rope_dim ones rotated; the scores' factor is the caller's `scale`.
//
// The rotated values are stored in pairs (x0, x1), (x2, x3), ... in the
// weights (DeepSeek's layout, kept as Hugging Face and llama.cpp have it);
// they are gathered into rotate-half order ([evens | odds]) and turned by
// ops::rope_inplace there, as Hugging Face's apply_rotary_pos_emb does:
// scores are sums over a head's values, so the order they sit in after the
// rotation is free as long as q and k agree.
//
// The heads then go through the grouped-query attention kernels as a fused
// qkv [N, 3 H D] with D = nope + rope_dim, H key/value heads, and each value
// head padded with zeros to D (v_dim <= D): the attention's output past
// v_dim is zero and is dropped before the output projection. So the flash
// attention, its backward, context parallelism's ring and the paged KV cache
// (which then holds per-head keys and values, not the latent) serve MLA
// unchanged. Everything here is column copies (ops::copy_columns,
// add_columns) over views, so every backend that has those runs it.
#pragma once
#include <algorithm>
#include <cmath>

#include "nn/linear.h"
#include "nn/norm.h"

namespace nk::nn {

struct LatentAttention {
  Linear q, q_a, q_b, kv_a, kv_b;  // q alone without a q rank, else q_a and q_b
  Norm q_a_norm, kv_a_norm;
  int64_t q_rank = 0, kv_rank = 0, nope = 0, rope_dim = 0, v_dim = 0;

  bool active() const { return kv_rank > 0; }
  int64_t head_dim() const { return nope + rope_dim; }

  // Per rows N of one forward: what the backward reads (qa, qa_n, ckv, ckv_n,
  // the rstds, o) and the forward's scratch (q, kva, kv, pe, ev, od, half, kf, tmp).
  struct Acts {
    Tensor q;                          // [N, H D]
    Tensor qa, qa_n, qa_rstd;          // [N, q_rank] x2, f32 [N] (with a q rank)
    Tensor kva;                        // [N, kv_rank + rope_dim]
    Tensor ckv, ckv_n, ckv_rstd;       // [N, kv_rank] x2, f32 [N]
    Tensor kv;                         // [N, H (nope + v_dim)]
    Tensor o;                          // [N, H v_dim]: the output projection's input
    Tensor pe, half, ev, od, kf, tmp;  // scratch: N H rope_dim x2, N H rope_dim / 2 x2,
                                       // N H D, N H max(nope, v_dim) elements
    bool defined() const { return kva.defined(); }
  };
  // The backward's scratch for N rows.
  struct Grads {
    Tensor d_o, dq, dkf, dkv, dckv_n, dckv, dkva, dqa_n, dqa, dx;
    Tensor pe, half, ev, od, tmp;
  };

  // alloc(shape, dtype) allocates one tensor.
  template <typename Alloc>
  Acts acts_for(int64_t N, int64_t H, DType dt, Alloc&& alloc) const {
    return acts_for(N, H, q_rank, kv_rank, nope, rope_dim, v_dim, dt, alloc);
  }
  template <typename Alloc>
  static Acts acts_for(int64_t N, int64_t H, int64_t q_rank, int64_t kv_rank, int64_t nope,
                       int64_t rope_dim, int64_t v_dim, DType dt, Alloc&& alloc) {
    const int64_t D = nope + rope_dim;
    Acts a;
    a.q = alloc(Shape{N, H * D}, dt);
    if (q_rank > 0) {
      a.qa = alloc(Shape{N, q_rank}, dt);
      a.qa_n = alloc(Shape{N, q_rank}, dt);
      a.qa_rstd = alloc(Shape{N}, DType::F32);
    }
    a.kva = alloc(Shape{N, kv_rank + rope_dim}, dt);
    a.ckv = alloc(Shape{N, kv_rank}, dt);
    a.ckv_n = alloc(Shape{N, kv_rank}, dt);
    a.ckv_rstd = alloc(Shape{N}, DType::F32);
    a.kv = alloc(Shape{N, H * (nope + v_dim)}, dt);
    a.o = alloc(Shape{N, H * v_dim}, dt);
    a.pe = alloc(Shape{N * H * rope_dim}, dt);
    a.half = alloc(Shape{N * H * rope_dim}, dt);
    a.ev = alloc(Shape{N * H * rope_dim / 2}, dt);
    a.od = alloc(Shape{N * H * rope_dim / 2}, dt);
    a.kf = alloc(Shape{N * H * D}, dt);
    a.tmp = alloc(Shape{N * H * std::max(nope, v_dim)}, dt);
    return a;
  }
  template <typename Alloc>
  static Grads grads_for(int64_t N, int64_t C, int64_t H, int64_t q_rank, int64_t kv_rank,
                         int64_t nope, int64_t rope_dim, int64_t v_dim, DType dt, Alloc&& alloc) {
    const int64_t D = nope + rope_dim;
    Grads g;
    g.d_o = alloc(Shape{N, H * v_dim}, dt);
    g.dq = alloc(Shape{N, H * D}, dt);
    g.dkf = alloc(Shape{N, H * D}, dt);
    g.dkv = alloc(Shape{N, H * (nope + v_dim)}, dt);
    g.dckv_n = alloc(Shape{N, kv_rank}, dt);
    g.dckv = alloc(Shape{N, kv_rank}, dt);
    g.dkva = alloc(Shape{N, kv_rank + rope_dim}, dt);
    if (q_rank > 0) {
      g.dqa_n = alloc(Shape{N, q_rank}, dt);
      g.dqa = alloc(Shape{N, q_rank}, dt);
    }
    g.dx = alloc(Shape{N, C}, dt);
    g.pe = alloc(Shape{N * H * rope_dim}, dt);
    g.half = alloc(Shape{N * H * rope_dim}, dt);
    g.ev = alloc(Shape{N * H * rope_dim / 2}, dt);
    g.od = alloc(Shape{N * H * rope_dim / 2}, dt);
    g.tmp = alloc(Shape{N * H * std::max(nope, v_dim)}, dt);
    return g;
  }

  // x [N, C] (rows of a [B, T] batch: bt = {B, T}) -> qkv [N, 3 H D], the
  // heads' rotary parts turned to `positions` (i32 [B, T]; undefined: 0..T-1
  // in every row).
  void qkv_forward(const Tensor& qkv, const Acts& a, const Tensor& x, int64_t H, const Tensor& rope,
                   const Tensor& positions, int64_t B, int64_t T) const {
    const int64_t N = B * T, D = head_dim();
    queries_forward(a, x, H, rope, positions, B, T);
    latent_forward(a, x);
    kv_b.forward(rows_of(a.kv, N), rows_of(a.ckv_n, N));
    const Tensor kh = shared_key(a, N, rope, positions, B, T);

    const Tensor A = qkv.view({N, 3 * H * D});
    ops::fill(A, 0.f);
    ops::add_columns(A, rows_of(a.q, N), 0, 1.f);
    // Keys: each head's k_nope, then the one rotated key every head shares.
    const Tensor kvh = rows_of(a.kv, N).view({N * H, nope + v_dim});
    const Tensor kf = mat(a.kf, N * H, D);
    ops::fill(kf, 0.f);
    const Tensor tn = mat(a.tmp, N * H, nope), tv = mat(a.tmp, N * H, v_dim);
    ops::copy_columns(tn, kvh, 0, 1.f);
    ops::add_columns(kf, tn, 0, 1.f);
    const Tensor kf_rows = kf.view({N, H * D});
    for (int64_t h = 0; h < H; ++h) ops::add_columns(kf_rows, kh, h * D + nope, 1.f);
    ops::add_columns(A, kf_rows, H * D, 1.f);
    // Values, zero past v_dim.
    ops::fill(kf, 0.f);
    ops::copy_columns(tv, kvh, nope, 1.f);
    ops::add_columns(kf, tv, 0, 1.f);
    ops::add_columns(A, kf_rows, 2 * H * D, 1.f);
  }

  // ---- decode over a latent KV cache ----
  // The cache of an MLA model holds, per token and layer, one row of
  // L = kv_rank + rope_dim values: [c (the normed latent) | k_r (the shared
  // key, rotated, in rotate-half order)], in place of every head's key and
  // value (what DeepSeek's inference and llama.cpp's deepseek2 keep). Head
  // h's score q_n . (W_uk c) + q_r . k_r equals (W_uk^T q_n) . c + q_r . k_r,
  // W_uk its nope rows of kv_b: the query absorbs W_uk and the row is the
  // one key of a multi-query attention of head size L. Its output
  // sum_j p_j W_uv c_j is W_uv (sum_j p_j c_j), W_uv its v_dim rows of kv_b:
  // the row is also the value, and W_uv is applied after the weighted sum
  // (whose last rope_dim values are dropped). So ops::attention_cached runs
  // it unchanged, with the cache's k and v one tensor [NB, 1, B, L].
  //
  // What a decode call needs beyond Acts, for N rows (model/kv_cache.cc
  // allocates them).
  struct CacheActs {
    Tensor qkv;   // [N, (H + 2) L]: absorbed queries, the row as key, as value
    Tensor out;   // [N, H L]: each head's weighted row
    Tensor a, b;  // [N, max(nope, rope_dim, kv_rank, v_dim)] each: a head's columns
    bool defined() const { return qkv.defined(); }
  };
  // x [N, C] new tokens of any sequences (token n of block-table row
  // seqs[n] at positions[n], i32 [1, N] each) -> y [N, C] through proj:
  // their rows stored in `cache` [NB, 1, B, L], then each attends over its
  // sequence's rows. wkv: kv_b's weight [H (nope + v_dim), kv_rank] dense
  // (kv_b.w, or a block-quantised kv_b dequantised). scale: the scores'
  // factor (0: 1/sqrt(nope + rope_dim), the head's own size, not L).
  void cached_forward(const Tensor& y, const Acts& a, const CacheActs& c, const Tensor& x,
                      const Tensor& cache, const Tensor& wkv, const Linear& proj,
                      const AdapterActs& ad, int64_t H, const Tensor& rope,
                      const Tensor& block_table, const Tensor& seqs, const Tensor& positions,
                      int64_t window, float scale, float softcap) const {
    const int64_t N = x.dim(0), D = head_dim(), r = rope_dim, L = kv_rank + r;
    NK_CHECK(
        c.defined() && cache.ndim() == 4 && cache.dim(1) == 1 && ops::kv_cache_head_dim(cache) == L,
        "LatentAttention: a latent cache {} is not [NB, 1, B, {}]",
        cache.defined() ? cache.desc() : std::string("(none)"), L);
    NK_CHECK(wkv.ndim() == 2 && wkv.dim(0) == H * (nope + v_dim) && wkv.dim(1) == kv_rank,
             "LatentAttention: kv_b weight {} is not [{}, {}]", wkv.desc(), H * (nope + v_dim),
             kv_rank);
    queries_forward(a, x, H, rope, positions, 1, N);
    latent_forward(a, x);
    const Tensor kh = shared_key(a, N, rope, positions, 1, N);
    const Tensor Q = mat(c.qkv, N, (H + 2) * L), O = mat(c.out, N, H * L), q = rows_of(a.q, N);
    const Tensor ckv_n = rows_of(a.ckv_n, N);
    ops::fill(Q, 0.f);
    for (int64_t at : {H * L, (H + 1) * L}) {  // the row, as the key and as the value
      ops::add_columns(Q, ckv_n, at, 1.f);
      ops::add_columns(Q, kh, at + kv_rank, 1.f);
    }
    const Tensor qn = mat(c.a, N, nope), qr = mat(c.a, N, r), ql = mat(c.b, N, kv_rank);
    for (int64_t h = 0; h < H; ++h) {
      // W_uk^T q_n: dx = dy W of the product x W_uk^T (its backward's input part).
      ops::copy_columns(qn, q, h * D, 1.f);
      ops::linear_backward(ql, Tensor(), Tensor(), qn, ql, wkv.narrow0(h * (nope + v_dim), nope));
      ops::add_columns(Q, ql, h * L, 1.f);
      ops::copy_columns(qr, q, h * D + nope, 1.f);
      ops::add_columns(Q, qr, h * L + kv_rank, 1.f);
    }
    ops::kv_cache_store(cache, cache, Q, H, block_table, seqs, positions);
    ops::attention_cached(O, Q, cache, cache, H, block_table, seqs, positions, window,
                          scale > 0.f ? scale : 1.f / std::sqrt(float(D)), softcap);
    const Tensor o = rows_of(a.o, N), cl = mat(c.a, N, kv_rank), ov = mat(c.b, N, v_dim);
    ops::fill(o, 0.f);
    for (int64_t h = 0; h < H; ++h) {
      ops::copy_columns(cl, O, h * L, 1.f);
      ops::linear_forward(ov, cl, wkv.narrow0(h * (nope + v_dim) + nope, v_dim), Tensor());
      ops::add_columns(o, ov, h * v_dim, 1.f);
    }
    proj.forward(y, o, ad);
  }

  // The attention's output out [N, H D] -> y [N, C] through o (the first
  // v_dim values of each head).
  void out_forward(const Tensor& y, const Acts& a, const Tensor& out, Linear const& proj,
                   int64_t H) const {
    const int64_t N = out.numel() / (H * head_dim());
    const Tensor o = rows_of(a.o, N);
    ops::copy_columns(o.view({N * H, v_dim}), out.view({N * H, head_dim()}), 0, 1.f);
    proj.forward(y, o);
  }

  // d out [N, H D] from dy [N, C]: the padding's gradient 0.
  void out_backward(const Tensor& dout, const Grads& g, const Tensor& dy, const Acts& a,
                    Linear const& proj, int64_t H) const {
    const int64_t N = dout.numel() / (H * head_dim());
    const Tensor d_o = rows_of(g.d_o, N);
    proj.backward(d_o, dy, rows_of(a.o, N));
    const Tensor dh = dout.view({N * H, head_dim()});
    ops::fill(dh, 0.f);
    ops::add_columns(dh, d_o.view({N * H, v_dim}), 0, 1.f);
  }

  // dqkv [N, 3 H D] -> dx [N, C] written; the projections' and norms'
  // gradients accumulate.
  void qkv_backward(const Tensor& dx, const Tensor& dqkv, const Acts& a, const Grads& g,
                    const Tensor& x, int64_t H, const Tensor& rope, const Tensor& positions,
                    int64_t B, int64_t T) const {
    const int64_t N = B * T, D = head_dim(), r = rope_dim;
    const Tensor dA = dqkv.view({N, 3 * H * D});
    const Tensor dkf = rows_of(g.dkf, N), dkf_h = dkf.view({N * H, D});
    const Tensor dkv = rows_of(g.dkv, N).view({N * H, nope + v_dim});
    ops::fill(dkv, 0.f);
    // Values, then keys: each head's own part into dkv.
    const Tensor tn = mat(g.tmp, N * H, nope), tv = mat(g.tmp, N * H, v_dim);
    ops::copy_columns(dkf, dA, 2 * H * D, 1.f);
    ops::copy_columns(tv, dkf_h, 0, 1.f);
    ops::add_columns(dkv, tv, nope, 1.f);
    ops::copy_columns(dkf, dA, H * D, 1.f);
    ops::copy_columns(tn, dkf_h, 0, 1.f);
    ops::add_columns(dkv, tn, 0, 1.f);
    // The shared rotated key: the sum over heads, turned back, in pairs again.
    const Tensor dkh = mat(g.half, N, r), t1 = mat(g.pe, N, r);
    ops::fill(dkh, 0.f);
    for (int64_t h = 0; h < H; ++h) {
      ops::copy_columns(t1, dkf, h * D + nope, 1.f);
      ops::accumulate(dkh, t1);
    }
    rotate(dkh, 1, rope, positions, B, T, true);
    const Tensor dkp = mat(g.pe, N, r);
    to_pairs(dkp, dkh, g.ev, g.od);
    const Tensor dckv_n = rows_of(g.dckv_n, N), dckv = rows_of(g.dckv, N);
    kv_b.backward(dckv_n, rows_of(g.dkv, N), rows_of(a.ckv_n, N));
    ops::fill(dckv, 0.f);  // Norm::backward accumulates
    kv_a_norm.backward(dckv, dckv_n, rows_of(a.ckv, N), Tensor(), a.ckv_rstd.narrow0(0, N));
    const Tensor dkva = rows_of(g.dkva, N);
    ops::fill(dkva, 0.f);
    ops::add_columns(dkva, dckv, 0, 1.f);
    ops::add_columns(dkva, dkp, kv_rank, 1.f);
    kv_a.backward(dx, dkva, x);

    // Queries: the rotary columns turned back and put in pairs again.
    const Tensor dq = rows_of(g.dq, N), dqh = dq.view({N * H, D});
    ops::copy_columns(dq, dA, 0, 1.f);
    const Tensor dh = mat(g.half, N * H, r), dp = mat(g.pe, N * H, r);
    ops::copy_columns(dh, dqh, nope, 1.f);
    ops::add_columns(dqh, dh, nope, -1.f);
    rotate(dh, H, rope, positions, B, T, true);
    to_pairs(dp, dh, g.ev, g.od);
    ops::add_columns(dqh, dp, nope, 1.f);
    const Tensor dx2 = rows_of(g.dx, N);
    if (q_rank > 0) {
      const Tensor dqa_n = rows_of(g.dqa_n, N), dqa = rows_of(g.dqa, N);
      q_b.backward(dqa_n, dq, rows_of(a.qa_n, N));
      ops::fill(dqa, 0.f);
      q_a_norm.backward(dqa, dqa_n, rows_of(a.qa, N), Tensor(), a.qa_rstd.narrow0(0, N));
      q_a.backward(dx2, dqa, x);
    } else {
      q.backward(dx2, dq, x);
    }
    ops::accumulate(dx, dx2);
  }

 private:
  // a.q [N, H D] <- the queries of x [N, C], each head's rotary values
  // replaced in place by their rotated rotate-half form: the columns
  // emptied exactly (x - x), then -(R (-x)) added.
  void queries_forward(const Acts& a, const Tensor& x, int64_t H, const Tensor& rope,
                       const Tensor& positions, int64_t B, int64_t T) const {
    const int64_t N = B * T, D = head_dim(), r = rope_dim;
    if (q_rank > 0) {
      q_a.forward(rows_of(a.qa, N), x);
      q_a_norm.forward(rows_of(a.qa_n, N), Tensor(), a.qa_rstd.narrow0(0, N), rows_of(a.qa, N));
      q_b.forward(rows_of(a.q, N), rows_of(a.qa_n, N));
    } else {
      q.forward(rows_of(a.q, N), x);
    }
    const Tensor qh = rows_of(a.q, N).view({N * H, D});
    const Tensor pe = mat(a.pe, N * H, r), half = mat(a.half, N * H, r);
    ops::copy_columns(pe, qh, nope, -1.f);
    ops::add_columns(qh, pe, nope, 1.f);
    to_half(half, pe, a.ev, a.od);
    rotate(half, H, rope, positions, B, T, false);
    ops::add_columns(qh, half, nope, -1.f);
  }
  // a.kva [N, kv_rank + rope_dim] <- kv_a x, a.ckv its latent, a.ckv_n normed.
  void latent_forward(const Acts& a, const Tensor& x) const {
    const int64_t N = x.dim(0);
    const Tensor kva = rows_of(a.kva, N), ckv = rows_of(a.ckv, N), ckv_n = rows_of(a.ckv_n, N);
    kv_a.forward(kva, x);
    ops::copy_columns(ckv, kva, 0, 1.f);
    kv_a_norm.forward(ckv_n, Tensor(), a.ckv_rstd.narrow0(0, N), ckv);
  }
  // The key every head shares, [N, rope_dim] in a.half: a.kva's last
  // rope_dim values in rotate-half order, turned to the positions (after
  // latent_forward; a.pe, a.ev and a.od are overwritten).
  Tensor shared_key(const Acts& a, int64_t N, const Tensor& rope, const Tensor& positions,
                    int64_t B, int64_t T) const {
    const int64_t r = rope_dim;
    const Tensor kp = mat(a.pe, N, r), kh = mat(a.half, N, r);
    ops::copy_columns(kp, rows_of(a.kva, N), kv_rank, 1.f);
    to_half(kh, kp, a.ev, a.od);
    rotate(kh, 1, rope, positions, B, T, false);
    return kh;
  }
  // The first rows x cols values of contiguous t as [rows, cols].
  static Tensor mat(const Tensor& t, int64_t rows, int64_t cols) {
    return t.view({-1}).narrow0(0, rows * cols).view({rows, cols});
  }
  static Tensor rows_of(const Tensor& t, int64_t N) { return mat(t, N, t.numel() / t.dim(0)); }
  // src [R, r] in pairs (x0, x1), (x2, x3), ... -> dst [R, r] = [evens | odds].
  static void to_half(const Tensor& dst, const Tensor& src, const Tensor& ev, const Tensor& od) {
    const int64_t R = dst.dim(0), h = dst.dim(1) / 2;
    const Tensor e = mat(ev, R * h, 1), o = mat(od, R * h, 1), pairs = src.view({R * h, 2});
    ops::copy_columns(e, pairs, 0, 1.f);
    ops::copy_columns(o, pairs, 1, 1.f);
    ops::fill(dst, 0.f);
    ops::add_columns(dst, e.view({R, h}), 0, 1.f);
    ops::add_columns(dst, o.view({R, h}), h, 1.f);
  }
  // to_half's inverse: src [R, r] = [evens | odds] -> dst in pairs.
  static void to_pairs(const Tensor& dst, const Tensor& src, const Tensor& ev, const Tensor& od) {
    const int64_t R = dst.dim(0), h = dst.dim(1) / 2;
    const Tensor e = mat(ev, R, h), o = mat(od, R, h), pairs = dst.view({R * h, 2});
    ops::copy_columns(e, src, 0, 1.f);
    ops::copy_columns(o, src, h, 1.f);
    ops::fill(dst, 0.f);
    ops::add_columns(pairs, e.view({R * h, 1}), 0, 1.f);
    ops::add_columns(pairs, o.view({R * h, 1}), 1, 1.f);
  }
  // t [B T, heads rope_dim] turned (or back: inverse) to its positions.
  void rotate(const Tensor& t, int64_t heads, const Tensor& rope, const Tensor& positions,
              int64_t B, int64_t T, bool inverse) const {
    const Tensor t3 = t.view({B, T, heads * rope_dim});
    if (positions.defined())
      ops::rope_inplace(t3, heads, rope_dim, rope, positions, inverse);
    else
      ops::rope_inplace(t3, heads, rope_dim, rope, 0, inverse);
  }
};

}  // namespace nk::nn
