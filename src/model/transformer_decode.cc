// The Transformer's cached decode step for the inference engine: a batch of
// new tokens from many sequences against the paged KV cache, logits only for
// the rows asked for.
#include "model/transformer.h"

#include "model/arch.h"

#include <algorithm>

namespace nk {

void Transformer::forward_cached(KVCache& kc, const CachedStep& st, Tensor logits) {
  NK_CHECK(stage_.whole(cfg_), "forward_cached on one pipeline stage");
  // Tensor parallel: every rank runs the step's every token over its heads
  // and MLP units, the row-parallel layers' partial sums added over the
  // group, the vocabulary-parallel head's logits gathered whole.
  NK_CHECK(kc.shape().tp == tp_.size(),
           "forward_cached: a cache for {} tensor-parallel ranks, the model is split over {}",
           kc.shape().tp, tp_.size());
  need_lm_head("generation");
  const int64_t N = int64_t(st.tokens.size()), R = int64_t(st.logit_rows.size());
  const int64_t M = kc.shape().table_width(), Q = int64_t(st.block_table.size()) / M;
  NK_CHECK(N > 0 && N <= kc.max_tokens(),
           "forward_cached: {} tokens, the cache's workspace holds {}", N, kc.max_tokens());
  NK_CHECK(int64_t(st.seqs.size()) == N && int64_t(st.positions.size()) == N,
           "forward_cached: {} tokens but {} sequences and {} positions", N, st.seqs.size(),
           st.positions.size());
  NK_CHECK(Q > 0 && Q <= kc.shape().max_seqs && int64_t(st.block_table.size()) == Q * M,
           "forward_cached: a block table of {} entries is not [Q <= {}, {}]",
           st.block_table.size(), kc.shape().max_seqs, M);
  NK_CHECK(kc.dtype() == compute_ && int64_t(kc.k.size()) == cfg_.n_layer,
           "forward_cached: cache ({} layers, {}) does not fit the model ({} layers, {})",
           kc.k.size(), dtype_name(kc.dtype()), cfg_.n_layer, dtype_name(compute_));
  check_shape(logits, {R, cfg_.vocab_size}, "logits");
  check_dtype(logits, DType::F32, "logits");
  Tensor tok = kc.tokens.narrow0(0, N), seq = kc.seq_ids.narrow0(0, N),
         pos = kc.positions.narrow0(0, N), table = kc.table.narrow0(0, Q);
  ops::copy_bytes_from_host(tok, st.tokens.data());
  ops::copy_bytes_from_host(seq, st.seqs.data());
  ops::copy_bytes_from_host(pos, st.positions.data());
  ops::copy_bytes_from_host(table, st.block_table.data());
  Tensor tok2 = tok.view({1, N}), pos2 = pos.view({1, N});
  Tensor x = kc.x.narrow0(0, N), ln = kc.ln.narrow0(0, N), tmp = kc.tmp.narrow0(0, N);
  Tensor mean = kc.mean.narrow0(0, N), rstd = kc.rstd.narrow0(0, N);
  const nn::AdapterActs ad = kc.adapters
                                 ? nn::AdapterActs{kc.lora_h, kc.adapters.get(), kc.adapter_stats}
                                 : nn::AdapterActs{};
  nn::MLP::Saved mlp;
  if (kc.h.defined()) mlp = {kc.h.narrow0(0, N), kc.a.narrow0(0, N), ad, ad, Tensor(), Tensor()};
  embed_.forward_cached(x.view({1, N, cfg_.d_model}), tok2, pos2);
  const float escale = embed_scale();
  if (prompt_.active()) {
    const int64_t n = prompt_.n();
    Tensor p;  // computed once, if any token is a virtual one
    for (int64_t i = 0; i < N; ++i) {
      const int32_t at = st.positions[size_t(i)];
      if (at >= n) continue;
      if (!p.defined()) p = prompt_.forward(kc.prompt);
      Tensor dst = x.narrow0(i, 1);
      if (embed_.wpe.defined())
        ops::add(dst, p.narrow0(at, 1), embed_.wpe.narrow0(at, 1));
      else
        ops::convert(dst, p.narrow0(at, 1));
    }
  }
  if (escale != 1.f) ops::scale(x, escale);
  if (kc.latent() && kc.mla_kv_b.empty()) dequantize_latent_kv_b(kc);
  // Post norms (Gemma): a sub-block's output norm(y) lands in ln, free by then.
  const bool post = cfg_.architecture().block().post_norms;
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const Block& b = blocks_[l];
    b.norm1.forward(ln, mean, rstd, x);
    b.attn.forward_cached(tmp, kc.qkv.narrow0(0, N), kc.att.narrow0(0, N), ln, kc.k[l], kc.v[l],
                          table, seq, pos2, ad, kc.qk, kc.mla, kc.mla_cache,
                          kc.latent() ? kc.mla_kv_b[l] : Tensor());
    if (post) b.post1.forward(ln, mean, rstd, tmp);
    ops::add(x, x, post ? ln : tmp);
    b.norm2.forward(ln, mean, rstd, x);
    // MoE: only the experts the N tokens were routed to are read.
    if (cfg_.moe_layer(int64_t(l)))
      b.moe.forward_cached(tmp, kc.moe, ln);
    else
      b.mlp.forward_cached(tmp, mlp, ln);
    if (post) b.post2.forward(ln, mean, rstd, tmp);
    ops::add(x, x, post ? ln : tmp);
  }
  // The final norm and the head only for the rows whose logits are wanted,
  // gathered head_rows at a time.
  for (int64_t r = 0; r < R; r += kc.head_rows) {
    const int64_t n = std::min(kc.head_rows, R - r);
    Tensor sel = kc.sel.narrow0(0, n);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t row = st.logit_rows[size_t(r + i)];
      NK_CHECK(row >= 0 && row < N, "forward_cached: logit row {} outside [0, {})", row, N);
      ops::convert(sel.narrow0(i, 1), x.narrow0(row, 1));
    }
    Tensor normed = kc.ln.narrow0(0, n);
    norm_f_.forward(normed, kc.mean.narrow0(0, n), kc.rstd.narrow0(0, n), sel);
    if (tp_.active()) {
      gather_vocab_logits(kc, normed, logits.narrow0(r, n));
      continue;
    }
    Tensor out = kc.head_logits.narrow0(0, n);
    head_.forward(out, normed);
    cap_logits(out);
    ops::convert(logits.narrow0(r, n), out);
  }
}

void Transformer::gather_vocab_logits(KVCache& kc, const Tensor& normed, Tensor logits) const {
  // Rank q holds ids [q V/t, (q+1) V/t) of the padded vocabulary and scores
  // its real ones (head_scored_rows_: none on a rank of padding alone);
  // each rank's block of V/t columns is gathered, the padding dropped.
  const int64_t t = tp_.size(), n = normed.dim(0), Vl = kc.head_logits.dim(1);
  const int64_t V = cfg_.vocab_size, cols = head_scored_rows_;
  Tensor local = kc.head_f32.narrow0(0, n * Vl).view({n, Vl});
  if (cols > 0) {
    // A block-quantised head scores its real rows to a whole group of 16 (bind_views).
    int64_t scored = 0;
    for (const ops::QuantWeight& q : head_.wquant) scored += q.rows();
    if (head_.wquant.empty()) scored = cols;
    Tensor out = kc.head_logits.view({-1}).narrow0(0, n * scored).view({n, scored});
    head_.forward(out, normed);
    cap_logits(out);
    if (cols == Vl) {
      ops::convert(local, out);
    } else {  // through logits' room, f32
      Tensor f = logits.view({-1}).narrow0(0, n * cols).view({n, cols});
      if (scored == cols) {
        ops::convert(f, out);
      } else {  // the padding's few logits dropped
        Tensor wide = kc.head_f32.narrow0(0, n * scored).view({n, scored});
        ops::convert(wide, out);
        ops::copy_columns(f, wide, 0, 1.f);
      }
      ops::fill(local, 0.f);
      ops::add_columns(local, f, 0, 1.f);
    }
  } else {
    ops::fill(local, 0.f);
  }
  Tensor all = kc.logits_all.narrow0(0, t * n * Vl);
  tp_.comm->all_gather(local, all);
  ops::fill(logits, 0.f);
  for (int64_t q = 0; q < t && q * Vl < V; ++q) {
    const int64_t m = std::min(Vl, V - q * Vl);
    Tensor part = all.narrow0(q * n * Vl, n * Vl).view({n, Vl});
    if (m < Vl) {  // its real ids' columns, made contiguous in the scratch
      Tensor cut = kc.head_f32.narrow0(0, n * m).view({n, m});
      ops::copy_columns(cut, part, 0, 1.f);
      part = cut;
    }
    ops::add_columns(logits, part, q * Vl, 1.f);
  }
}

void Transformer::dequantize_latent_kv_b(KVCache& kc) const {
  for (const Block& b : blocks_) {
    const nn::Linear& kv_b = b.attn.mla.kv_b;
    if (kv_b.w.defined()) {  // read in place
      kc.mla_kv_b.push_back(Tensor());
      continue;
    }
    NK_CHECK(!kv_b.wquant.empty(),
             "forward_cached: MLA's kv_b has neither a dense nor a "
             "block-quantised weight");
    int64_t rows = 0;
    for (const ops::QuantWeight& q : kv_b.wquant) rows += q.rows();
    Tensor d = Tensor::empty({rows, kv_b.wquant[0].cols()}, compute_, kc.x.device());
    int64_t r0 = 0;
    for (const ops::QuantWeight& q : kv_b.wquant) {
      ops::quant_dequantize(d.narrow0(r0, q.rows()), q);
      r0 += q.rows();
    }
    kc.mla_kv_b.push_back(d);
  }
}

}  // namespace nk
