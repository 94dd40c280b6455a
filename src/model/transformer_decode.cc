// The Transformer's cached decode step for the inference engine: a batch of
// new tokens from many sequences against the paged KV cache, logits only for
// the rows asked for.
#include "model/transformer.h"

#include "model/arch.h"

#include <algorithm>

namespace nk {

void Transformer::forward_cached(KVCache& kc, const CachedStep& st, Tensor logits) {
  NK_CHECK(stage_.whole(cfg_), "forward_cached on one pipeline stage");
  NK_CHECK(!tp_.active(), "forward_cached: inference under tensor parallelism is not supported");
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
  embed_.forward(x.view({1, N, cfg_.d_model}), tok2, pos2);
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
      b.moe.forward(tmp, kc.moe, ln, /*dropless=*/true);
    else
      b.mlp.forward(tmp, mlp, ln);
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
    Tensor out = kc.head_logits.narrow0(0, n);
    head_.forward(out, normed);
    cap_logits(out);
    ops::convert(logits.narrow0(r, n), out);
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
