// The Transformer's training and scoring step: embedding, blocks, final norm
// and head forward, the loss, and the backward in reverse (whole model or one
// pipeline stage's layers). Weights and arenas: transformer_weights.cc.
#include "model/transformer.h"

#include "model/arch.h"

#include <algorithm>
#include <cmath>

namespace nk {

namespace {

// The packed rows' document starts and positions (both undefined without;
// positions alone: one document per row at explicit positions).
std::pair<Tensor, Tensor> packed_tensors(const PackedBatchInfo* packed) {
  if (!packed) return {};
  NK_CHECK(packed->position_ids.defined(), "PackedBatchInfo needs position_ids");
  return {packed->cu_seqlens, packed->position_ids};
}

// The MoE layers among [0, n) (the others are dense: cfg.moe_layer).
std::vector<int64_t> moe_layers(const ModelConfig& cfg, int64_t n) {
  std::vector<int64_t> out;
  for (int64_t l = 0; l < n; ++l)
    if (cfg.moe_layer(l)) out.push_back(l);
  return out;
}

}  // namespace

void Transformer::for_virtual_rows(int64_t B, int64_t T, int64_t rows,
                                   const std::function<void(int64_t, int64_t, int64_t)>& f) const {
  // Each row's T positions as runs of consecutive global positions: the
  // row, or under context parallelism its two chunks of c (at
  // nn::cp_global_position). Under sequence parallelism this rank holds
  // rows [lo, lo + rows) of the B·T (nn/tensor_parallel.h); else all.
  const int64_t n = prompt_.n(), lo = tp_.sp() ? tp_.rank() * rows : 0;
  const int64_t cp = cp_.size(), c = T / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < (cp > 1 ? 2 : 1); ++k) {
      const int64_t local = b * T + k * c, len = cp > 1 ? c : T;
      const int64_t global = cp > 1 ? nn::cp_global_position(k * c, cp_.rank(), cp, c) : 0;
      // The run's virtual positions [global, n), then this rank's rows of them.
      const int64_t first = std::max(local, lo);
      const int64_t last = std::min({local + std::min(len, n - global), lo + rows});
      if (first < last) f(first - lo, global + (first - local), last - first);
    }
}

void Transformer::place_prompt(Tensor x, int64_t B, int64_t T, nn::Prompt::Saved& s) const {
  const int64_t n = prompt_.n();
  if (T * cp_.size() < n)
    fail("a sequence of {} positions is shorter than p-tuning's {} virtual tokens", T * cp_.size(),
         n);
  const Tensor p = prompt_.forward(s);
  for_virtual_rows(B, T, x.dim(0), [&](int64_t row, int64_t v, int64_t len) {
    Tensor dst = x.narrow0(row, len);
    if (embed_.wpe.defined())
      ops::add(dst, p.narrow0(v, len), embed_.wpe.narrow0(v, len));
    else
      ops::convert(dst, p.narrow0(v, len));
  });
}

void Transformer::embed_forward(Activations& a, const Tensor& tokens,
                                const PackedBatchInfo* packed) {
  check_shape(tokens, {a.B, a.T}, "tokens");
  NK_CHECK(stage_.embedding, "embed_forward: this pipeline stage holds no embedding");
  embed_.forward(a.res[0], tokens, packed_tensors(packed).second, a.full_x);
  // Packed rows: the prompt goes before each row's first document (the
  // trainer gives p-tuning one sample per row).
  if (prompt_.active()) place_prompt(nn::rows(a.res[0]), a.B, a.T, a.prompt);
  // Gemma scales whatever embeddings go in, virtual tokens' included.
  if (const float s = embed_scale(); s != 1.f) ops::scale(a.res[0], s);
}

float Transformer::embed_scale() const {
  if (!cfg_.architecture().block().embed_scale) return 1.f;
  // HF: torch.tensor(hidden_size ** 0.5, dtype=hidden_states.dtype).
  const float s = float(std::sqrt(double(cfg_.d_model)));
  return compute_ == DType::BF16 ? bf16_to_f32(f32_to_bf16(s)) : s;
}

void Transformer::cap_logits(const Tensor& logits) const {
  if (cfg_.final_logit_softcap > 0)
    ops::softcap_forward(logits, logits, float(cfg_.final_logit_softcap));
}

void Transformer::blocks_forward(Activations& a, int64_t first, int64_t last,
                                 const PackedBatchInfo* packed) {
  NK_CHECK(0 <= first && first <= last && last <= cfg_.n_layer,
           "blocks_forward: layers [{}, {}) of {}", first, last, cfg_.n_layer);
  for (int64_t l = first; l < last; ++l)
    NK_CHECK(stage_.holds_layer(cfg_, l), "blocks_forward: layer {} is another pipeline stage's",
             l);
  const auto [cu, pos] = packed_tensors(packed);
  if (a.adapters) {
    a.adapters->seed = dropout_seed_;
    a.adapters->off = !adapters_on_;
  }
  for (int64_t l = first; l < last; ++l) {
    layer_forward(a, l, cu, pos, true);
    if (a.observer_ && a.dres.defined()) a.observer_->forward_done(a, l);
  }
}

void Transformer::layer_forward(Activations& a, int64_t l, const Tensor& cu, const Tensor& pos,
                                bool output) {
  const bool training = a.layers.size() == blocks_.size();
  const Block& b = blocks_[size_t(l)];
  Activations::Layer& y = a.layers[training ? size_t(l) : 0];
  // Post norms (Gemma): each sub-block's output y saved, norm(y) into tmp.
  const bool post = y.attn_y.defined();
  b.norm1.forward(nn::rows(y.ln1), y.mean1, y.rstd1, nn::rows(a.res[l]));
  b.attn.forward(post ? y.attn_y : a.tmp, y.attn, y.ln1, cu, pos);
  if (post) b.post1.forward(nn::rows(a.tmp), Tensor(), y.rstd3, nn::rows(y.attn_y));
  ops::add(y.res_mid, a.res[l], a.tmp);
  b.norm2.forward(nn::rows(y.ln2), y.mean2, y.rstd2, nn::rows(y.res_mid));
  ffn_forward(a, l, post ? y.mlp_y : a.tmp, y.ln2);
  if (post) b.post2.forward(nn::rows(a.tmp), Tensor(), y.rstd4, nn::rows(y.mlp_y));
  if (output) ops::add(a.res[l + 1], y.res_mid, a.tmp);
}

void Transformer::ffn_forward(Activations& a, int64_t l, Tensor y, const Tensor& x) {
  const bool training = a.layers.size() == blocks_.size();
  const Block& b = blocks_[size_t(l)];
  Activations::Layer& s = a.layers[training ? size_t(l) : 0];
  if (!cfg_.moe_layer(l)) {
    b.mlp.forward(y, s.mlp, x);
    return;
  }
  b.moe.forward(y, s.moe, x);
  // Copies of equal size: no allocation.
  const nn::MoeRouting& r = *s.moe.routing;
  a.moe_counts[size_t(l)] = r.count;
  a.moe_stats[size_t(l)] = r.stats;
  a.moe_dropped[size_t(l)] = r.dropped;
  if (!a.moe_seq_counts.empty()) {  // the sequence-wise loss's counts, per sequence
    const int64_t k = cfg_.num_experts_per_tok, E = cfg_.num_experts;
    std::vector<int64_t>& n = a.moe_seq_counts[size_t(l)];
    std::fill(n.begin(), n.end(), 0);
    for (int64_t i = 0; i < a.B * a.T * k; ++i) ++n[size_t((i / k / a.T) * E + r.idx[size_t(i)])];
  }
  if (!cp_.active()) return;
  // Context parallel: the cp ranks hold chunks of the same rows, so the
  // layer's routing record (counts, score and z sums, dropped pairs, and
  // per sequence, a row being a segment) summed over the group is the whole
  // rows', and the MoE losses are one process's (moe_losses, moe_loss_grads).
  auto sum = [&](void* v, size_t n, DType dt) {
    cp_.comm->all_reduce(Tensor::from_blob(v, Shape{int64_t(n)}, dt));
  };
  sum(a.moe_counts[size_t(l)].data(), a.moe_counts[size_t(l)].size(), DType::I64);
  sum(a.moe_stats[size_t(l)].data(), a.moe_stats[size_t(l)].size(), DType::F32);
  sum(&a.moe_dropped[size_t(l)], 1, DType::I64);
  if (!a.moe_seq_counts.empty())
    sum(a.moe_seq_counts[size_t(l)].data(), a.moe_seq_counts[size_t(l)].size(), DType::I64);
}

void Transformer::set_expert_parallel(const nn::ExpertParallel& ep) {
  if (ep.active() && (!cfg_.is_moe() || cfg_.num_experts % ep.size()))
    fail("parallel.ep = {}: model.num_experts = {} does not split into equal counts over the ranks",
         ep.size(), cfg_.num_experts);
  NK_CHECK(!experts_split_ || (ep.size() == ep_.size() && ep.rank() == ep_.rank()),
           "set_expert_parallel: the experts are split over {} ranks already", ep_.size());
  ep_ = ep;
  if (ep_.active() && !experts_split_) split_experts();
  for (Block& b : blocks_) b.moe.ep = ep;
}

void Transformer::set_context_parallel(const nn::ContextParallel& cp) {
  cp_ = cp;
  for (Block& b : blocks_) b.attn.cp = cp;
}

Transformer::MoeLosses Transformer::moe_losses(const Activations& a) const {
  MoeLosses out;
  if (!cfg_.is_moe()) return out;
  // The MoE layers (cfg_.moe_layer; the others are dense).
  const int64_t E = cfg_.num_experts, k = cfg_.num_experts_per_tok;
  const std::vector<int64_t> moe = moe_layers(cfg_, int64_t(a.moe_stats.size()));
  // The tokens of the rows (a context-parallel rank holds T / cp of each;
  // its routing record is the whole rows', ffn_forward).
  const int64_t L = int64_t(moe.size()), S = a.moe_segments, T = a.B * a.T * cp_.size() / S;
  const double tokens = double(L) * double(a.B * a.T * cp_.size());
  if (cfg_.moe_aux_loss_type == "seq") {
    // DeepSeek-V3's sequence-wise loss: per layer and sequence E / (k T)
    // sum_e count_e (P_e / T), averaged over both.
    for (int64_t l : moe)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t e = 0; e < E; ++e)
          out.aux += double(a.moe_seq_counts[size_t(l)][size_t(s * E + e)]) *
                     double(a.moe_stats[size_t(l)][size_t(s * (E + 1) + e)]);
    out.aux *= double(E) / (double(k) * double(T) * double(T) * double(L) * double(S));
  } else {
    // HF's load_balancing_loss_func over the layers' router logits
    // concatenated: f_e and P_e are means over every layer's tokens.
    for (int64_t e = 0; e < E; ++e) {
      double f = 0, p = 0;
      for (int64_t l : moe) {
        f += double(a.moe_counts[size_t(l)][size_t(e)]);
        for (int64_t s = 0; s < S; ++s)
          p += double(a.moe_stats[size_t(l)][size_t(s * (E + 1) + e)]);
      }
      out.aux += (f / tokens) * (p / tokens);
    }
    out.aux *= double(E);
  }
  for (int64_t l : moe)
    for (int64_t s = 0; s < S; ++s)
      out.z += double(a.moe_stats[size_t(l)][size_t(s * (E + 1) + E)]);
  out.z /= tokens;
  const double pairs = double(a.B * a.T * cp_.size() * k);
  for (int64_t l : moe) {
    const std::vector<int64_t>& n = a.moe_counts[size_t(l)];
    out.load_max =
        std::max(out.load_max, double(*std::max_element(n.begin(), n.end())) * double(E) / pairs);
    out.dropped += double(a.moe_dropped[size_t(l)]) / (pairs * double(L));
  }
  return out;
}

void Transformer::moe_loss_grads(const Activations& a, int64_t layer, std::vector<float>& balance,
                                 float& z) const {
  const int64_t E = cfg_.num_experts, k = cfg_.num_experts_per_tok;
  const std::vector<int64_t> moe = moe_layers(cfg_, int64_t(a.moe_stats.size()));
  const int64_t L = int64_t(moe.size()), S = a.moe_segments, T = a.B * a.T * cp_.size() / S;
  const double tokens = double(L) * double(a.B * a.T * cp_.size()),
               scale = double(a.moe_grad_scale);
  if (cfg_.moe_aux_loss_type == "seq") {
    // d aux / d score[l, n, e] (n in sequence s) = E count_{l,s,e} / (k T^2 L S).
    const double c = scale * cfg_.moe_aux_loss_coeff * double(E) /
                     (double(k) * double(T) * double(T) * double(L) * double(S));
    for (int64_t i = 0; i < S * E; ++i)
      balance[size_t(i)] = float(c * double(a.moe_seq_counts[size_t(layer)][size_t(i)]));
  } else {
    // d (coeff E sum_e f_e P_e) / d score[l, n, e] = coeff E f_e / tokens,
    // the same for every row.
    for (int64_t e = 0; e < E; ++e) {
      double f = 0;
      for (int64_t l : moe) f += double(a.moe_counts[size_t(l)][size_t(e)]);
      const float g = float(scale * cfg_.moe_aux_loss_coeff * double(E) * (f / tokens) / tokens);
      for (int64_t s = 0; s < S; ++s) balance[size_t(s * E + e)] = g;
    }
  }
  z = float(scale * cfg_.moe_z_loss_coeff / tokens);
}

void Transformer::final_norm_forward(Activations& a) {
  norm_f_.forward(nn::rows(a.lnf), a.meanf, a.rstdf, nn::rows(a.res.back()));
}

void Transformer::forward_body(Activations& a, const Tensor& tokens,
                               const PackedBatchInfo* packed) {
  NK_CHECK(stage_.whole(cfg_), "the whole forward on one pipeline stage");
  embed_forward(a, tokens, packed);
  blocks_forward(a, 0, int64_t(blocks_.size()), packed);
  final_norm_forward(a);
}

// Rows [r, r + n) of the head and cross-entropy: the logits [n,
// head_scored_rows_] in the chunk buffer (fewer columns than it has on a rank
// whose share of the vocabulary ends in padding; none on one holding only
// padding, whose partial dx is then zero), the losses, and with backward dx
// and the head's weight gradient.
void Transformer::head_chunk(Activations& a, const Tensor& x, const Tensor& dx, const Tensor& tg,
                             int64_t r, int64_t n, bool backward, float scale,
                             const Tensor& row_scale) {
  NK_CHECK(head_.wquant.empty() || !tp_.active(),
           "head_chunk: a block-quantised head under tensor parallelism scores in decode only");
  const int64_t cols = head_scored_rows_;
  Tensor logits, xr = x.narrow0(r, n);
  if (cols == a.logits.dim(1))
    logits = a.logits.narrow0(0, n);
  else if (cols > 0)
    logits = a.logits.view({-1}).narrow0(0, n * cols).view({n, cols});
  if (logits.defined()) head_.forward(logits, xr);
  // Soft-capped logits y = c tanh(z / c): the backward needs y.
  const bool capped = logits.defined() && cfg_.final_logit_softcap > 0;
  Tensor y;
  if (capped) {
    cap_logits(logits);
    if (backward) {
      y = a.capped.view({-1}).narrow0(0, logits.numel()).view(logits.shape());
      ops::convert(y, logits);
    }
  }
  // A temperature t: the loss of logits / t, whose gradient with respect to
  // the logits carries another 1 / t.
  const float inv_t = 1.f / logit_temperature_;
  if (logits.defined() && inv_t != 1.f) ops::scale(logits, inv_t);
  loss_.forward(a.losses.narrow0(r, n), logits, tg.narrow0(r, n), backward, scale * inv_t,
                a.ce_stats);
  if (backward && logits.defined() && row_scale.defined())
    ops::scale_rows(logits, row_scale.narrow0(r, n));
  if (backward && capped) ops::softcap_backward(logits, logits, y, float(cfg_.final_logit_softcap));
  if (backward && logits.defined()) head_.backward(dx.narrow0(r, n), logits, xr);
  if (backward && !logits.defined()) ops::fill(dx.narrow0(r, n), 0.f);
}

// LM head and cross-entropy in row chunks; with backward, also d lnf and the
// head's weight gradient chunk by chunk, then the final norm's backward.
float Transformer::head_loss(Activations& a, const Tensor& targets, bool backward,
                             float grad_scale) {
  check_shape(targets, {a.B, a.T}, "targets");
  NK_CHECK(stage_.head, "head_loss: this pipeline stage holds no head");
  need_lm_head("the language-model loss");
  NK_CHECK(!backward || a.dres.defined(), "head_loss: backward needs training activations");
  final_norm_forward(a);
  int64_t N = a.B * a.T;
  // Context parallel: the row's targets are spread over the cp group.
  int64_t valid = cp_.total(ops::count_not_equal(targets, kIgnoreIndex));
  float row_scale = valid ? grad_scale / float(valid) : 0.f;
  // The head is column-parallel over the vocabulary: every row in, this
  // rank's columns of the logits out.
  Tensor x = nn::rows(tp_.enter(a.lnf, a.full_x));
  Tensor dx = backward ? nn::rows(tp_.enter_grad(a.dln, a.full_y)) : Tensor();
  Tensor tg = targets.view({N});
  for (int64_t r = 0; r < N; r += a.chunk)
    head_chunk(a, x, dx, tg, r, std::min(a.chunk, N - r), backward, row_scale);
  if (backward) tp_.enter_backward(a.dln, a.full_y);
  ops::copy_to_host(a.losses, a.host_losses.data());
  double sum = 0;
  for (float v : a.host_losses) sum += v;
  if (backward) {
    // dres carries d loss / d residual stream from the top down.
    ops::fill(a.dres, 0.f);
    norm_f_.backward(nn::rows(a.dres), nn::rows(a.dln), nn::rows(a.res.back()), a.meanf, a.rstdf);
    flush_grads(head_unit());
    a.moe_grad_scale = grad_scale;
  }
  const double ce = valid ? sum / double(valid) : 0.0;
  // Training: the objective is the cross-entropy plus the MoE losses. Under
  // context parallelism ce is this rank's tokens' share, and the MoE losses
  // (the whole rows', on every cp rank) count 1 / cp each, so that the cp
  // ranks' sum is one process's loss (their gradients are each rank's
  // tokens' part of the whole rows' already: moe_loss_grads).
  return float(backward ? ce + moe_losses(a).total(cfg_) / double(cp_.size()) : ce);
}

void Transformer::head_rows(Activations& a, const Tensor& targets, const float* scale,
                            double* row_nll, const float* token_scale, float* token_nll,
                            const float* value_grad, float moe_grad_scale) {
  check_shape(targets, {a.B, a.T}, "targets");
  NK_CHECK(stage_.head, "head_rows: this pipeline stage holds no head");
  need_lm_head("sequence log-probabilities");
  const bool backward = scale != nullptr || token_scale != nullptr;
  NK_CHECK(!backward || a.dres.defined(), "head_row_backward needs training activations");
  // A sequence objective adds the MoE losses only when it asks to.
  a.moe_grad_scale = backward ? moe_grad_scale : 0.f;
  // Under sequence parallelism the head reads every row (tp_.enter gathers
  // them, as head_loss's does): whole rows' sums on every rank.
  final_norm_forward(a);
  const int64_t T = a.T;
  Tensor x = nn::rows(tp_.enter(a.lnf, a.full_x));
  Tensor dx = backward ? nn::rows(tp_.enter_grad(a.dln, a.full_y)) : Tensor();
  Tensor tg = targets.view({a.B * T});
  if (token_scale) {  // a weight per position: chunks may cross rows
    const int64_t N = a.B * T;
    Tensor w = Tensor::empty({N}, DType::F32, device_);
    ops::copy_from_host(w, token_scale);
    for (int64_t r = 0; r < N; r += a.chunk)
      head_chunk(a, x, dx, tg, r, std::min(a.chunk, N - r), true, 1.f, w);
  } else {
    // Chunks never cross a row, so each row's gradient takes its own scale.
    for (int64_t b = 0; b < a.B; ++b)
      for (int64_t r = b * T; r < (b + 1) * T; r += a.chunk) {
        const int64_t n = std::min(a.chunk, (b + 1) * T - r);
        head_chunk(a, x, dx, tg, r, n, backward, backward ? scale[b] : 0.f);
      }
  }
  if (token_nll) ops::copy_to_host(a.losses, token_nll);
  if (row_nll) {
    ops::copy_to_host(a.losses, a.host_losses.data());
    for (int64_t b = 0; b < a.B; ++b) {
      double sum = 0;  // ignored targets' losses are 0
      for (int64_t t = 0; t < T; ++t) sum += a.host_losses[size_t(b * T + t)];
      row_nll[b] = sum;
    }
  }
  if (!backward) return;
  tp_.enter_backward(a.dln, a.full_y);
  if (value_grad) {  // d lnf += dv w; the value head's own gradients accumulate
    // Over every row (x: gathered under sequence parallelism; every rank
    // computes them alike, so the value head's gradient is whole and the
    // same on every rank), of which this rank adds its own rows'.
    const int64_t N = a.B * T, mine = tp_.local_rows(N);
    Tensor dv = Tensor::empty({N, 1}, DType::F32, device_);
    ops::copy_from_host(dv, value_grad);
    Tensor dy = Tensor::empty({N, 1}, a.lnf.dtype(), device_);
    ops::convert(dy, dv);
    Tensor dx_v = Tensor::empty({N, cfg_.d_model}, a.dln.dtype(), device_);
    value_.backward(dx_v, dy, x);
    ops::accumulate(nn::rows(a.dln), tp_.sp() ? dx_v.narrow0(tp_.rank() * mine, mine) : dx_v);
  }
  ops::fill(a.dres, 0.f);
  norm_f_.backward(nn::rows(a.dres), nn::rows(a.dln), nn::rows(a.res.back()), a.meanf, a.rstdf);
  flush_grads(head_unit());
}

void Transformer::head_row_nll(Activations& a, const Tensor& targets, std::span<double> row_nll) {
  NK_CHECK(int64_t(row_nll.size()) == a.B, "head_row_nll: {} sums for {} rows", row_nll.size(),
           a.B);
  head_rows(a, targets, nullptr, row_nll.data());
}

void Transformer::head_row_backward(Activations& a, const Tensor& targets,
                                    std::span<const float> row_scale, float moe_grad_scale) {
  NK_CHECK(int64_t(row_scale.size()) == a.B, "head_row_backward: {} scales for {} rows",
           row_scale.size(), a.B);
  head_rows(a, targets, row_scale.data(), nullptr, nullptr, nullptr, nullptr, moe_grad_scale);
}

void Transformer::head_token_nll(Activations& a, const Tensor& targets,
                                 std::span<float> token_nll) {
  NK_CHECK(int64_t(token_nll.size()) == a.B * a.T, "head_token_nll: {} values for {} positions",
           token_nll.size(), a.B * a.T);
  head_rows(a, targets, nullptr, nullptr, nullptr, token_nll.data());
}

void Transformer::head_token_backward(Activations& a, const Tensor& targets,
                                      std::span<const float> token_scale,
                                      std::span<const float> value_grad, float moe_grad_scale) {
  NK_CHECK(int64_t(token_scale.size()) == a.B * a.T,
           "head_token_backward: {} scales for {} positions", token_scale.size(), a.B * a.T);
  NK_CHECK(value_grad.empty() || (cfg_.value_head && int64_t(value_grad.size()) == a.B * a.T),
           "head_token_backward: {} value gradients for {} positions (value head: {})",
           value_grad.size(), a.B * a.T, cfg_.value_head);
  head_rows(a, targets, nullptr, nullptr, token_scale.data(), nullptr,
            value_grad.empty() ? nullptr : value_grad.data(), moe_grad_scale);
}

void Transformer::value_forward(Activations& a, std::span<float> values) {
  // Under tensor parallelism the value head is whole on every rank, as the
  // final norm's output is; under sequence parallelism it reads that
  // output's rows gathered (every rank computes every position's value).
  NK_CHECK(cfg_.value_head && stage_.head,
           "value_forward: a value head on the head's stage, whole rows");
  const int64_t N = a.B * a.T;
  NK_CHECK(int64_t(values.size()) == N, "value_forward: {} values for {} positions", values.size(),
           N);
  Tensor y = Tensor::empty({N, 1}, a.lnf.dtype(), device_);
  value_.forward(y, nn::rows(tp_.enter(a.lnf, a.full_x)));
  Tensor v = Tensor::empty({N, 1}, DType::F32, device_);
  ops::convert(v, y);
  ops::copy_to_host(v, values.data());
}

void Transformer::set_logit_temperature(float t) {
  NK_CHECK(t > 0 && std::isfinite(t), "set_logit_temperature: {}", t);
  logit_temperature_ = t;
}

void Transformer::need_lm_head(const char* what) const {
  if (cfg_.classifier())
    fail(
        "{}: a sequence classifier (num_labels = {}: a reward or attribute model) has a score "
        "head, "
        "not an LM head; it scores sequences (nekton eval reward) and does not generate",
        what, cfg_.num_labels);
}

std::pair<Tensor, Tensor> Transformer::score_row(Activations& a, const Tensor& x,
                                                 std::span<const int64_t> last, int64_t b) {
  NK_CHECK(last[size_t(b)] >= 0 && last[size_t(b)] < a.T, "score: row {}'s last position {} of {}",
           b, last[size_t(b)], a.T);
  const int64_t n = cfg_.num_labels;
  return {x.narrow0(b * a.T + last[size_t(b)], 1), a.logits.view({-1}).narrow0(0, n).view({1, n})};
}

void Transformer::score_forward(Activations& a, std::span<const int64_t> last,
                                std::span<float> scores) {
  NK_CHECK(cfg_.classifier(), "score_forward: the model has no score head");
  NK_CHECK(stage_.head, "score_forward: this pipeline stage holds no head");
  const int64_t n = cfg_.num_labels;
  NK_CHECK(int64_t(last.size()) == a.B && int64_t(scores.size()) == a.B * n,
           "score_forward: {} positions and {} scores for {} rows of {} labels", last.size(),
           scores.size(), a.B, n);
  final_norm_forward(a);
  // Under tensor parallelism the score head is whole on every rank, as the
  // final norm's output is; under sequence parallelism that output's rows
  // are gathered first (a row's last position is on one rank), and every
  // rank scores every row alike.
  const Tensor x = nn::rows(tp_.enter(a.lnf, a.full_x));
  for (int64_t b = 0; b < a.B; ++b) {
    if (last[size_t(b)] < 0) {  // context parallel: another rank's position
      std::fill_n(scores.data() + b * n, n, 0.f);
      continue;
    }
    auto [xb, y] = score_row(a, x, last, b);
    head_.forward(y, xb);
    ops::copy_to_host(y, scores.data() + b * n);
  }
}

void Transformer::score_backward(Activations& a, std::span<const int64_t> last,
                                 std::span<const float> dscores, float moe_grad_scale) {
  NK_CHECK(cfg_.classifier() && a.dres.defined(),
           "score_backward: a score head and training activations");
  const int64_t n = cfg_.num_labels;
  NK_CHECK(int64_t(last.size()) == a.B && int64_t(dscores.size()) == a.B * n,
           "score_backward: {} positions and {} gradients for {} rows of {} labels", last.size(),
           dscores.size(), a.B, n);
  // Only the scored positions get a gradient from the head. Under sequence
  // parallelism every rank computes every row's alike (the rows gathered
  // again: the buffer is scratch) and keeps its own rows' share; the head's
  // weight gradient is then whole and the same on every rank, as without.
  const Tensor x = nn::rows(tp_.enter(a.lnf, a.full_x));
  const Tensor dx = nn::rows(tp_.enter_grad(a.dln, a.full_y));
  ops::fill(dx, 0.f);
  for (int64_t b = 0; b < a.B; ++b) {
    if (last[size_t(b)] < 0) continue;
    auto [xb, dy] = score_row(a, x, last, b);
    ops::copy_from_host(dy, dscores.data() + b * n);
    head_.backward(dx.narrow0(b * a.T + last[size_t(b)], 1), dy, xb);
  }
  if (tp_.sp()) {
    const int64_t mine = tp_.local_rows(a.B * a.T);
    ops::convert(nn::rows(a.dln), dx.narrow0(tp_.rank() * mine, mine));
  }
  ops::fill(a.dres, 0.f);
  norm_f_.backward(nn::rows(a.dres), nn::rows(a.dln), nn::rows(a.res.back()), a.meanf, a.rstdf);
  flush_grads(head_unit());
  a.moe_grad_scale = moe_grad_scale;
}

void Transformer::token_scores_forward(Activations& a, std::span<float> values) {
  NK_CHECK(cfg_.num_labels == 1 && stage_.whole(cfg_) && !tp_.active(),
           "token_scores_forward: a whole one-label sequence classifier");
  const int64_t N = a.B * a.T;
  NK_CHECK(int64_t(values.size()) == N, "token_scores_forward: {} values for {} positions",
           values.size(), N);
  final_norm_forward(a);
  Tensor y = Tensor::empty({N, 1}, a.lnf.dtype(), device_);
  head_.forward(y, nn::rows(a.lnf));
  Tensor v = Tensor::empty({N, 1}, DType::F32, device_);
  ops::convert(v, y);
  ops::copy_to_host(v, values.data());
}

void Transformer::token_scores_backward(Activations& a, std::span<const float> dvalues) {
  NK_CHECK(cfg_.num_labels == 1 && stage_.whole(cfg_) && !tp_.active() && a.dres.defined(),
           "token_scores_backward: a whole one-label sequence classifier, training activations");
  const int64_t N = a.B * a.T;
  NK_CHECK(int64_t(dvalues.size()) == N, "token_scores_backward: {} gradients for {} positions",
           dvalues.size(), N);
  Tensor dy = Tensor::empty({N, 1}, a.lnf.dtype(), device_);
  ops::copy_from_host(dy, dvalues.data());
  const Tensor dx = nn::rows(a.dln);
  ops::fill(dx, 0.f);
  head_.backward(dx, dy, nn::rows(a.lnf));
  ops::fill(a.dres, 0.f);
  norm_f_.backward(nn::rows(a.dres), nn::rows(a.dln), nn::rows(a.res.back()), a.meanf, a.rstdf);
  flush_grads(head_unit());
}

void Transformer::blocks_backward(Activations& a, int64_t first, int64_t last,
                                  const PackedBatchInfo* packed) {
  NK_CHECK(a.layers.size() == blocks_.size() && a.dres.defined(),
           "blocks_backward needs training activations");
  NK_CHECK(0 <= first && first <= last && last <= cfg_.n_layer,
           "blocks_backward: layers [{}, {}) of {}", first, last, cfg_.n_layer);
  for (int64_t l = first; l < last; ++l)
    NK_CHECK(stage_.holds_layer(cfg_, l), "blocks_backward: layer {} is another pipeline stage's",
             l);
  NK_CHECK(adapters_on_, "blocks_backward: the adapters are switched off (set_adapters_enabled)");
  const auto [cu, pos] = packed_tensors(packed);
  if (a.adapters) {
    a.adapters->seed = dropout_seed_;
    a.adapters->off = false;
  }
  for (int64_t l = last - 1; l >= first; --l) {
    const Block& b = blocks_[size_t(l)];
    Activations::Layer& y = a.layers[size_t(l)];
    if (a.observer_) a.observer_->backward_next(a, l);
    // What the layer's forward dropped, recomputed from what it kept: the
    // same kernels on the same inputs, so the same bits.
    if (a.recompute_of(l) == Recompute::Full) layer_forward(a, l, cu, pos, false);
    if (a.recompute_of(l) == Recompute::Selective) {
      b.norm1.forward(nn::rows(y.ln1), y.mean1, y.rstd1, nn::rows(a.res[l]));
      b.norm2.forward(nn::rows(y.ln2), y.mean2, y.rstd2, nn::rows(y.res_mid));
      if (!cfg_.moe_layer(l)) b.mlp.activation_forward(y.mlp);  // a MoE layer keeps its own
    }
    // Post norms: d (sub-block output) = post's backward of d residual.
    const bool post = y.attn_y.defined();
    auto through_post = [&](const nn::Norm& n, const Tensor& x, const Tensor& rstd) {
      if (!post) return a.dres;
      ops::fill(a.dpost, 0.f);  // the norm's dx accumulates
      n.backward(nn::rows(a.dpost), nn::rows(a.dres), nn::rows(x), Tensor(), rstd);
      return a.dpost;
    };
    const Tensor dmlp_y = through_post(b.post2, y.mlp_y, y.rstd4);
    if (cfg_.moe_layer(l)) {
      float zg = 0.f;
      moe_loss_grads(a, l, a.moe_balance, zg);
      b.moe.backward(a.dln, dmlp_y, y.moe, a.dmoe, y.ln2, a.moe_balance, zg);
    } else {
      b.mlp.backward(a.dln, dmlp_y, y.mlp, a.dmlp, y.ln2);
    }
    b.norm2.backward(nn::rows(a.dres), nn::rows(a.dln), nn::rows(y.res_mid), y.mean2, y.rstd2);
    const Tensor dattn_y = through_post(b.post1, y.attn_y, y.rstd3);
    b.attn.backward(a.dln, dattn_y, y.attn, a.dattn, y.ln1, cu, pos);
    b.norm1.backward(nn::rows(a.dres), nn::rows(a.dln), nn::rows(a.res[l]), y.mean1, y.rstd1);
    flush_grads(l);
  }
}

void Transformer::embed_backward(Activations& a, const Tensor& tokens,
                                 const PackedBatchInfo* packed) {
  NK_CHECK(a.dres.defined(), "embed_backward needs training activations");
  NK_CHECK(stage_.embedding, "embed_backward: this pipeline stage holds no embedding");
  if (const float s = embed_scale(); s != 1.f) ops::scale(a.dres, s);
  if (prompt_.active()) {
    // The virtual positions' gradient, summed over the rows, is the
    // prompt's; their tokens get none. (Under sequence parallelism the
    // rank's rows' part: the group adds the prompt's gradients,
    // tensor_parallel_partial_grads.)
    const bool trained = prompt_.dtable.defined();
    Tensor d = nn::rows(a.dres);
    if (trained) ops::fill(a.prompt.dp, 0.f);
    for_virtual_rows(a.B, a.T, d.dim(0), [&](int64_t row, int64_t v, int64_t len) {
      if (trained) ops::accumulate(a.prompt.dp.narrow0(v, len), d.narrow0(row, len));
      ops::fill(d.narrow0(row, len), 0.f);
    });
    if (trained) prompt_.backward(a.prompt);
  }
  embed_.backward(a.dres, tokens, packed_tensors(packed).second, a.full_x);
  flush_grads(embed_unit());
}

float Transformer::forward_loss(Activations& a, const Tensor& tokens, const Tensor& targets,
                                const PackedBatchInfo* packed) {
  embed_forward(a, tokens, packed);
  blocks_forward(a, 0, int64_t(blocks_.size()), packed);
  return head_loss(a, targets, false, 0.f);
}

float Transformer::forward_backward(Activations& a, const Tensor& tokens, const Tensor& targets,
                                    float grad_scale, const PackedBatchInfo* packed) {
  NK_CHECK(a.layers.size() == blocks_.size() && a.dres.defined(),
           "forward_backward needs training activations");
  const int64_t L = int64_t(blocks_.size());
  embed_forward(a, tokens, packed);
  blocks_forward(a, 0, L, packed);
  float loss = head_loss(a, targets, true, grad_scale);
  blocks_backward(a, 0, L, packed);
  embed_backward(a, tokens, packed);
  return loss;
}

void Transformer::forward_all_logits(Activations& a, const Tensor& tokens, Tensor logits,
                                     const PackedBatchInfo* packed) {
  NK_CHECK(!tp_.active(), "forward_all_logits: the logits are split under tensor parallelism");
  need_lm_head("logits");
  int64_t N = a.B * a.T;
  check_shape(logits, {N, cfg_.vocab_size}, "logits");
  forward_body(a, tokens, packed);
  for (int64_t r = 0; r < N; r += a.chunk) {
    int64_t n = std::min(a.chunk, N - r);
    Tensor chunk = a.logits.narrow0(0, n);
    head_.forward(chunk, nn::rows(a.lnf).narrow0(r, n));
    cap_logits(chunk);
    ops::convert(logits.narrow0(r, n), chunk);
  }
}

void Transformer::forward_last_logits(Activations& a, const Tensor& tokens, Tensor logits) {
  NK_CHECK(!tp_.active(), "forward_last_logits: the logits are split under tensor parallelism");
  need_lm_head("logits");
  check_shape(logits, {a.B, cfg_.vocab_size}, "logits");
  forward_body(a, tokens, nullptr);
  // Gather the last position of each sequence, then one small head product.
  for (int64_t b = 0; b < a.B; ++b) {
    Tensor last = nn::rows(a.lnf).narrow0(b * a.T + a.T - 1, 1);
    Tensor out = a.logits.narrow0(0, 1);
    head_.forward(out, last);
    cap_logits(out);
    ops::convert(logits.narrow0(b, 1), out);
  }
}

}  // namespace nk
