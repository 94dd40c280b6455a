// Every numeric kernel Nekton uses, forward and backward.
//
// Conventions (llm.c style):
//  - N = B*T rows, C channels. Activations are in the compute dtype T (f32 or
//    bf16); internal arithmetic is fp32.
//  - Parameter gradients (dw, db, dwte, ...) are always f32 and ACCUMULATED
//    (+=), so micro-batches sum into the gradient arena.
//  - Activation gradients are written (overwritten) unless the comment says
//    "accumulates".
//  - Optional gradients: an UNDEFINED gradient argument (dx, dw, db, dwte,
//    dwpe where the comment allows it) is not computed, and no work is spent
//    on it; the other outputs are exactly what they would be otherwise. Frozen
//    parameters pass an undefined weight gradient.
//  - Each public function (defined in ops/<family>.cc) checks shapes, dtypes
//    and that its tensors share one device, then calls that device's kernel
//    (ops/dispatch.h): the CPU kernels are in ops/cpu/ (kernels.h), a CUDA
//    backend adds ops/cuda/ beside them; a device without a kernel is an
//    nk::Error naming the op. The plain reference is in ops/ref/ (used by the
//    tests).
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace nk::ops {

// ---- copies and conversions ----
void convert(Tensor dst, const Tensor& src);  // same shape, any float dtypes
void fill(Tensor dst, float value);
void copy_to_host(const Tensor& src, float* dst);  // src numel floats
void copy_from_host(Tensor dst, const float* src);
// dst += src (same shape). Residual-add backward and gradient accumulation.
void accumulate(Tensor dst, const Tensor& src);
// y = a + b (residual add forward). y may alias a or b.
void add(Tensor y, const Tensor& a, const Tensor& b);
// Sum of squares of all elements, deterministic (fixed chunking), double.
double sum_squares(const Tensor& x);
void scale(Tensor x, float s);
// Column blocks of row-major matrices (LoRA on one fused part of a linear
// layer's output). y [N, M], z [N, m], 0 <= col0, col0 + m <= M.
// y[:, col0 : col0+m] += s * z.
void add_columns(Tensor y, const Tensor& z, int64_t col0, float s);
// z = s * y[:, col0 : col0+m] (written).
void copy_columns(Tensor z, const Tensor& y, int64_t col0, float s);
// y[:, col0 + j] *= l[j] for j < m (IA3's learned scaling of some output
// columns, or of every input column). y [N, M], l [m] in y's dtype.
void scale_columns(Tensor y, const Tensor& l, int64_t col0);
// y[n, :] *= s[n]: a weight per row (a per-token gradient weight on the
// cross-entropy's logit gradients). y [N, M] f32 or bf16, s f32 [N].
void scale_rows(Tensor y, const Tensor& s);
// dl[j] += sum_n a[n, col0 + j] * b[n, j]: IA3's scale gradient. dl f32 [m]
// accumulates; a [N, M], b [N, m] in one dtype. Deterministic.
void column_dot(Tensor dl, const Tensor& a, int64_t col0, const Tensor& b);
// Inverted dropout: y = x * keep / (1 - p), keep = 0 with probability p, drawn
// per element index from `seed` alone (a counter-based hash), so calling it
// again with the same seed on a gradient applies the same mask. y may alias x.
// 0 <= p < 1; p = 0 copies.
void dropout(Tensor y, const Tensor& x, float p, uint64_t seed);
// Number of NaN and +-Inf values among all elements (any float dtype): the
// check on weights before they are loaded, saved or served.
int64_t count_nonfinite(const Tensor& x);

// ---- embeddings ----
// out[n,:] = wte[tok[n],:] + (wpe defined ? wpe[pos(n),:] : 0), pos(n) = n % T,
// or positions[n] when positions i32[B,T] is defined (packed rows restart at 0
// per document). tokens i32[B,T]; wte T[V,C]; wpe T[maxT,C] or undefined; out
// T[B,T,C]. Throws nk::Error naming the token if an id is outside [0, V).
// vocab_start >= 0: wte is one shard of a vocabulary split over ranks (its
// rows are ids [vocab_start, vocab_start + V)); other ids read a zero row
// (Megatron's vocabulary-parallel embedding, summed over the shards next);
// only negative ids are refused then.
void embedding_forward(Tensor out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       const Tensor& positions = Tensor(), int64_t vocab_start = -1);
// dwte[tok[n],:] += dout[n,:]; dwpe[pos(n),:] += dout[n,:]. dwte/dwpe f32;
// either may be undefined (not computed). Deterministic (no atomics). With
// vocab_start >= 0, ids outside the shard add nothing to dwte.
void embedding_backward(Tensor dwte, Tensor dwpe, const Tensor& dout, const Tensor& tokens,
                        const Tensor& positions = Tensor(), int64_t vocab_start = -1);

// ---- normalisation ---- x,y T[N,C]; w,b T[C]; mean,rstd f32[N] saved for backward.
void layernorm_forward(Tensor y, Tensor mean, Tensor rstd, const Tensor& x, const Tensor& w,
                       const Tensor& b, float eps);
// dx ACCUMULATES (it is the residual stream's gradient); dw, db f32 accumulate
// (each may be undefined: not computed).
void layernorm_backward(Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x,
                        const Tensor& w, const Tensor& mean, const Tensor& rstd);
// y = x rstd (w_offset + w), rstd = 1/sqrt(mean(x^2) + eps), in f32. w_offset 1:
// Gemma's RMSNorm, whose weight is stored centred at 0 (scale 1 + w).
void rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps,
                     float w_offset = 0.f);
// dx accumulates; dw f32 accumulates (undefined: not computed). w_offset as
// in the forward (d y / d w does not depend on it).
void rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, float w_offset = 0.f);

// ---- linear: y[N,out] = x[N,in] @ w[out,in]^T + b[out] ----
// b may be undefined. x, w, y share the compute dtype (bf16 goes through
// oneDNN with fp32 accumulation).
void linear_forward(Tensor y, const Tensor& x, const Tensor& w, const Tensor& b);
// dx = dy @ w (written); dw += dy^T @ x (f32); db += sum_n dy (f32). Each of
// dx, dw, db may be undefined: not computed.
void linear_backward(Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x,
                     const Tensor& w);

// ---- NF4: QLoRA's 4-bit NormalFloat weights, stored as bitsandbytes does ----
// A frozen weight of `shape` is flattened row-major into blocks of kNf4Block
// values (the last may be short). Each value becomes the 4-bit index of the
// nearest of the 16 NF4 levels (kNf4Levels, ties to the lower index) to
// w / absmax, absmax = max |w| over its block (an all-zero block codes 0.0);
// two codes per byte, the first in the high nibble (an odd count pads a 0
// nibble). The block absmaxes are quantised again ("double quantisation"):
// a = absmax - offset, offset = the mean of the tensor's absmaxes (summed in
// order in double, rounded to f32 once), in blocks of kNf4ScaleBlock as the
// 8-bit index of the nearest of the 256 signed dynamic levels
// (nf4_dynamic_levels(), ties to the lower index) to a / max |a| over that
// block (max |a| = 0 codes 0.0), with max |a| kept in f32. A value reads back
// as kNf4Levels[code] * (dynamic[acode] * scale + offset), in f32. 0.516
// bytes per value for blocks of 64 (0.5 + 1/64 + 4/16384).
constexpr int64_t kNf4Block = 64, kNf4ScaleBlock = 256;
extern const float kNf4Levels[16];
// The 256 levels of bitsandbytes' signed dynamic map (create_dynamic_map:
// for i = 0..6, the midpoints of linspace(0.1, 1, 2^i + 1) times +-10^(i-6),
// plus 0 and 1, sorted), computed in double and rounded to f32.
const float* nf4_dynamic_levels();

struct Nf4Weight {
  Shape shape;           // the dense weight's shape
  Tensor codes;          // u8 [ceil(numel / 2)]
  Tensor absmax_codes;   // u8 [blocks], blocks = ceil(numel / kNf4Block)
  Tensor absmax_scale;   // f32 [ceil(blocks / scale_block)]
  Tensor absmax_offset;  // f32 [1]
  // Blocks per absmax_scale entry, a power of two: kNf4ScaleBlock as
  // nf4_quantize writes a weight; fewer in a shard cut from a whole one
  // (nf4_take_shard).
  int64_t scale_block = kNf4ScaleBlock;
  // Uninitialised storage for a weight of `shape` (numel > 0).
  static Nf4Weight empty(const Shape& shape, Device device = kHost,
                         int64_t scale_block = kNf4ScaleBlock);
  bool defined() const { return codes.defined(); }
  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const;  // all four tensors
  // The first `rows` rows (0 < rows <= shape[0]) of a 2-d weight: views of
  // its storage that read back as those rows of it do (a vocabulary shard's
  // real rows before its padding).
  Nf4Weight first_rows(int64_t rows) const;
};

// q (allocated for w's shape, scale_block kNf4ScaleBlock) <- NF4 of w (f32,
// contiguous). Deterministic. A NaN or infinity in w is an nk::Error naming
// its index; q is left as it was.
void nf4_quantize(Nf4Weight& q, const Tensor& w);
// A shard of an NF4 weight (a tensor-parallel rank's share of a whole one
// quantised as one process does, so that every rank reads the values one
// process holds) as the whole weight's flattened values it holds, in
// order: `len` values from `start`, or (start < 0) `len` zeros (the rows of
// vocabulary padding). Each piece must be whole blocks of the whole weight:
// `start` a multiple of kNf4Block, and every piece but the last `len` one
// too (nf4_pieces_misaligned names the first that is not).
struct Nf4Piece {
  int64_t start = 0, len = 0;
};
// The index of the first piece that is not whole blocks; -1 if none.
int64_t nf4_pieces_misaligned(const std::vector<Nf4Piece>& pieces);
// The scale_block of a shard cut as `pieces`: the largest power of two up to
// kNf4ScaleBlock for which each of the shard's scale blocks draws its blocks
// from one scale block of the whole weight (so the whole's scales serve it
// unchanged): kNf4ScaleBlock for a run of whole rows starting on one,
// kNf4ScaleBlock / n for every row's n-th share of columns (rows of up to
// kNf4ScaleBlock blocks), 1 at worst.
int64_t nf4_shard_scale_block(const std::vector<Nf4Piece>& pieces);
// shard (host, of pieces' total values, Nf4Weight::empty with
// nf4_shard_scale_block(pieces)) <- the blocks of `whole` (host, as
// nf4_quantize writes it) that pieces name, their absmax codes, scales and
// offset; zero pieces code 0.0. Every value of the shard reads back (in
// nf4_dequantize and the ops below) bit for bit as the whole's value does.
void nf4_take_shard(Nf4Weight& shard, const Nf4Weight& whole, const std::vector<Nf4Piece>& pieces);
// out (f32 or bf16, contiguous, any shape) <- the values [start, start +
// out.numel()) of q's flattened weight, each read back in f32 then rounded
// to out's dtype.
void nf4_dequantize(Tensor out, const Nf4Weight& q, int64_t start = 0);
// y[N,out] = x[N,in] @ W^T + b with W [out, in] the dequantised q rounded to
// x's dtype: the product runs over panels of W's rows dequantised into a
// small cache-sized buffer, so the dense W never exists whole. The same
// dtypes as linear_forward; equals linear_forward on nf4_dequantize(q) up to
// the order of the f32 sums.
void nf4_linear_forward(Tensor y, const Tensor& x, const Nf4Weight& w, const Tensor& b);
// dx[N,in] = dy[N,out] @ W (written), by panels of W's columns. A frozen
// weight: there is no dw.
void nf4_linear_backward_input(Tensor dx, const Tensor& dy, const Nf4Weight& w);
// embedding_forward with wte stored as NF4 (rows dequantised as they are
// gathered); wpe dense or undefined. With vocab_start >= 0, wte is a shard of
// the table (ids [vocab_start, vocab_start + rows)) and other ids read
// zeros (plus wpe), as embedding_forward. A frozen table: no backward.
void nf4_embedding_forward(Tensor out, const Tensor& tokens, const Nf4Weight& wte,
                           const Tensor& wpe, const Tensor& positions = Tensor(),
                           int64_t vocab_start = -1);

// ---- activations ----
// GELU, tanh approximation: 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3))). x,y T[N,F].
void gelu_forward(Tensor y, const Tensor& x);
void gelu_backward(Tensor dx, const Tensor& dy, const Tensor& x);  // dx may alias dy
// SiLU (swish): x sigmoid(x), as bottleneck adapters use it. x,y T[...].
void silu_forward(Tensor y, const Tensor& x);                      // y may alias x
void silu_backward(Tensor dx, const Tensor& dy, const Tensor& x);  // dx may alias dy
// ReLU: max(x, 0), as p-tuning's prompt encoder uses it; its gradient at 0 is 0.
void relu_forward(Tensor y, const Tensor& x);                      // y may alias x
void relu_backward(Tensor dx, const Tensor& dy, const Tensor& x);  // dx may alias dy
// SwiGLU over a fused [gate | up] input: gu T[N,2F]; y[n,f] = silu(gu[n,f]) * gu[n,F+f].
void swiglu_forward(Tensor y, const Tensor& gu);
void swiglu_backward(Tensor dgu, const Tensor& dy, const Tensor& gu);
// GeGLU with the tanh GELU (Gemma's gelu_pytorch_tanh) over the same fused
// [gate | up] input: y[n,f] = gelu(gu[n,f]) * gu[n,F+f]. CPU only.
void geglu_forward(Tensor y, const Tensor& gu);
void geglu_backward(Tensor dgu, const Tensor& dy, const Tensor& gu);
// Soft-capping (Gemma 2's final logits): y = cap tanh(x / cap), cap > 0; the
// backward from the output, dx = dy (1 - (y / cap)^2). y may alias x, dx dy.
// CPU only.
void softcap_forward(Tensor y, const Tensor& x, float cap);
void softcap_backward(Tensor dx, const Tensor& dy, const Tensor& y, float cap);

// ---- rotary embedding (Hugging Face rotate-half convention) ----
// table f32[maxT, D]: [:, :D/2] = cos(t*f_i), [:, D/2:] = sin(t*f_i), f_i = theta^(-2i/D).
Tensor rope_table(int64_t max_t, int64_t head_dim, double theta);
// In place on x T[B,T,W]: rotates the first n_heads*head_dim columns of every row,
// head by head, at positions pos0 + t. inverse=true applies the transpose (backward).
// A table narrower than the head, f32[maxT, R] with R even and R <= head_dim,
// is partial rotary (HF's partial_rotary_factor): each head's first R values
// rotate as a head of R would (pairs (i, i + R/2)), the other head_dim - R
// pass through unchanged.
void rope_inplace(Tensor x, int64_t n_heads, int64_t head_dim, const Tensor& table,
                  int64_t pos0 = 0, bool inverse = false);
// The same with an explicit position per token: positions i32[B,T], each in
// [0, maxT) (packed rows restart at 0 per document).
void rope_inplace(Tensor x, int64_t n_heads, int64_t head_dim, const Tensor& table,
                  const Tensor& positions, bool inverse = false);

// ---- causal attention with grouped-query heads ----
// qkv T[B,T,(Hq+2*Hkv)*D] packs q heads, then k heads, then v heads per token.
// out T[B,T,Hq*D]; lse f32[B,Hq,T] (log-sum-exp of scaled scores, saved).
// Query head h reads kv head h / (Hq/Hkv). Scale 1/sqrt(D). The fast path is
// tiled with an online softmax and never holds a T x T matrix.
//
// Packed rows (several documents per row): cu_seqlens i32[B, S+1] gives each
// row's cumulative document starts, the FlashAttention/Megatron varlen
// convention applied per row: 0 = c_0 <= c_1 <= ... <= c_S = T; rows with
// fewer than S documents repeat T at the end (empty documents are allowed).
// Token t of document [c_k, c_{k+1}) attends only to tokens s with
// c_k <= s <= t. Undefined cu_seqlens: plain causal, one document per row.
// The fast path skips key tiles that lie wholly in earlier documents and masks
// the tiles that straddle a boundary. (Per-row starts rather than segment ids:
// S+1 numbers per row to validate and the kernel needs only each token's
// document start, expanded once per call.)
//
// Sliding window (Mistral; transformers' sliding_window, llama.cpp's n_swa):
// window > 0 lets token t attend only to s with t - window < s <= t (window
// keys, itself included), on top of the document constraint; 0 = full causal.
// A window >= T is full causal (bit for bit). The fast path skips key tiles
// wholly outside the window and masks the tiles that straddle its edge.
//
// scale: the scores' factor, 0 for 1/sqrt(D) (Gemma's query_pre_attn_scalar
// q gives 1/sqrt(q)). softcap > 0 (Gemma 2's attn_logit_softcapping): each
// scaled score s becomes softcap tanh(s / softcap) before the softmax; lse is
// of the capped scores. A scale other than 1/sqrt(D) and a softcap are CPU only.
void attention_forward(Tensor out, Tensor lse, const Tensor& qkv, int64_t n_q_heads,
                       int64_t n_kv_heads, const Tensor& cu_seqlens = Tensor(), int64_t window = 0,
                       float scale = 0.f, float softcap = 0.f);
// dqkv (same layout as qkv) is written. cu_seqlens, window, scale and softcap
// as in the forward.
void attention_backward(Tensor dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, int64_t n_q_heads, int64_t n_kv_heads,
                        const Tensor& cu_seqlens = Tensor(), int64_t window = 0, float scale = 0.f,
                        float softcap = 0.f);

// ---- attention of local queries to one block of keys and values ----
// Context parallelism's ring attention (nn/context_parallel.h): a rank's
// queries meet the key/value blocks of every rank in turn, each block's
// softmax merged into a running result through the log-sum-exp.
// qkv T[B,Tq,(Hq+2*Hkv)*D] (its q heads are read), kv T[B,Tk,2*Hkv*D] (k
// heads then v heads per token), qpos and kpos i32[Tq], i32[Tk]: the tokens'
// global positions (the same for every row). Query i sees key j iff
// kpos[j] <= qpos[i], and with window > 0 also qpos[i] - kpos[j] < window
// (ops::attention_forward's mask on the global positions). Packed rows:
// qstart i32[B,Tq] is each query's document start (a global position), and
// query i of row b sees key j only if also kpos[j] >= qstart[b,i]; undefined:
// one document per row. scale and softcap as ops::attention_forward's (0:
// 1/sqrt(D), uncapped).
// out f32[B,Tq,Hq*D] (normalised) and lse f32[B,Hq,Tq] are the running
// result: start them at 0 and -inf; after the call they are the softmax over
// the keys seen so far and this block's (lse' = log(e^lse + e^lse_block)). A
// query that sees no key of the block is left as it was. CPU only.
void attention_block_forward(Tensor out, Tensor lse, const Tensor& qkv, const Tensor& kv,
                             const Tensor& qpos, const Tensor& kpos, int64_t n_q_heads,
                             int64_t n_kv_heads, int64_t window = 0,
                             const Tensor& qstart = Tensor(), float scale = 0.f,
                             float softcap = 0.f);
// One block's share of the backward, given the FINAL out T[B,Tq,Hq*D] and
// lse (after every block): dq f32[B,Tq,Hq*D] (d loss / d q, the rotated
// query as stored in qkv) and dkv f32[B,Tk,2*Hkv*D] (d k, d v) accumulate.
// dout T[B,Tq,Hq*D]. Summed over the blocks, the gradients of
// attention_forward over the whole sequence.
void attention_block_backward(Tensor dq, Tensor dkv, const Tensor& dout, const Tensor& out,
                              const Tensor& lse, const Tensor& qkv, const Tensor& kv,
                              const Tensor& qpos, const Tensor& kpos, int64_t n_q_heads,
                              int64_t n_kv_heads, int64_t window = 0,
                              const Tensor& qstart = Tensor(), float scale = 0.f,
                              float softcap = 0.f);

// ---- attention over a KV cache (inference) ----
// The cache of one layer is k_cache, v_cache C[NB, Hkv, B, D]: NB blocks of B
// positions, each kv head's positions in a block contiguous (a decode step
// streams them). A sequence's positions live in the blocks its row of
// block_table i32[Q, M] names: position p in block block_table[q, p / B] at
// offset p % B (a paged cache; the contiguous cache of S slots of L positions
// is the case NB = S, B = L, block_table [S, 1] = 0..S-1). New tokens
// n = 0..N-1 of any mix of sequences, prefill and decode alike, are the rows of
// qkv T[N, (Hq+2*Hkv)*D] (q and k already rotated), with seqs i32[N] (their
// block_table row) and positions i32[N] (< M * B). There is no padding: each
// token names its own sequence and position. C, the cache's dtype, is f32,
// bf16 or f16 whatever T (f32 or bf16) is: values are rounded to C when
// stored and read back widened to fp32. Or u8 for q8_0 rows (CPU only):
// each row of D values (D a multiple of 32) is D / 32 of ggml's Q8_0
// blocks (an f16 scale max|x| / 127 and 32 int8 values, 34 bytes), so the
// cache's last dimension is D / 32 * 34 bytes (kv_cache_row_width); rows
// are quantised when stored and dequantised as they stream by.
//
// The last dimension of a cache of rows of `values` values in dtype c (u8:
// q8_0 blocks; nk::Error unless values is a multiple of 32), and the values
// a row of k_cache holds (its head dim D).
inline constexpr int64_t kKvQ8Values = 32, kKvQ8Bytes = 34;
int64_t kv_cache_row_width(int64_t values, DType c);
int64_t kv_cache_head_dim(const Tensor& k_cache);
// Stores token n's k and v heads at position positions[n] of sequence seqs[n].
void kv_cache_store(Tensor k_cache, Tensor v_cache, const Tensor& qkv, int64_t n_q_heads,
                    const Tensor& block_table, const Tensor& seqs, const Tensor& positions);
// out T[N, Hq*D]: query head h of token n attends, with scale 1/sqrt(D), to kv
// head h/(Hq/Hkv) of sequence seqs[n] at positions [0, positions[n]] (its own
// k/v included, so store first); with window > 0 only at positions
// [max(0, p - window + 1), p], p = positions[n] (as attention_forward's window).
// Positions outside that span are ignored, whatever they hold: a reused block
// needs no clearing. Every block a token reads must be in [0, NB). scale and
// softcap as attention_forward's.
void attention_cached(Tensor out, const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                      int64_t n_q_heads, const Tensor& block_table, const Tensor& seqs,
                      const Tensor& positions, int64_t window = 0, float scale = 0.f,
                      float softcap = 0.f);

// ---- softmax cross-entropy over the vocabulary ----
// logits T[N,V]; targets i32[N]; losses f32[N] (0 where target == ignore_index).
// Online max/sum over vocabulary chunks: one read of the logits for the loss.
void cross_entropy_forward(Tensor losses, const Tensor& logits, const Tensor& targets,
                           int64_t ignore_index);
// Fused forward + backward: losses as above and dlogits = (softmax - onehot) *
// grad_scale (0 rows for ignored targets). dlogits may alias logits.
void cross_entropy_forward_backward(Tensor losses, Tensor dlogits, const Tensor& logits,
                                    const Tensor& targets, int64_t ignore_index, float grad_scale);

// ---- vocabulary-parallel cross-entropy (Megatron's) ----
// The logits of a row split by vocabulary over shards (shard k holds ids
// [vocab_start, vocab_start + Vs)): each shard reduces its part to three
// numbers per row, the shards combine them, and each shard's backward needs
// only the combined log-sum-exp. The full logits never exist on one rank.
//   1. cross_entropy_shard_stats on every shard;
//   2. an all-reduce MAX of row_max -> global_max, cross_entropy_rescale_stats
//      (sumexp now relative to global_max), an all-reduce SUM of sumexp and of
//      target_logit (one shard holds each target; the others hold 0);
//   3. cross_entropy_shard_finish -> losses and lse (the same on every shard);
//   4. cross_entropy_shard_backward on every shard.
// With one shard (vocab_start 0, Vs = V) steps 2's reductions are identities.
// The model's head uses the fused ops above at one shard (bit-identical
// history); these are for a vocabulary split across a tensor-parallel group.
//
// logits T[N, Vs]; targets i32[N] (global ids); row_max, sumexp, target_logit
// f32[N]: per row the shard's max, sum of exp(x - row_max) and the target's
// logit (0 when the target is not in the shard or is ignored).
void cross_entropy_shard_stats(Tensor row_max, Tensor sumexp, Tensor target_logit,
                               const Tensor& logits, const Tensor& targets, int64_t vocab_start);
// sumexp *= exp(row_max - global_max); row_max = global_max (all f32[N]).
void cross_entropy_rescale_stats(Tensor row_max, Tensor sumexp, const Tensor& global_max);
// losses, lse f32[N]: lse = max + log(sumexp); loss = lse - target_logit, 0
// (and lse 0) where target == ignore_index.
void cross_entropy_shard_finish(Tensor losses, Tensor lse, const Tensor& row_max,
                                const Tensor& sumexp, const Tensor& target_logit,
                                const Tensor& targets, int64_t ignore_index);
// dlogits T[N, Vs] = (exp(x - lse) - onehot(target - vocab_start)) * grad_scale,
// 0 rows for ignored targets. dlogits may alias logits.
void cross_entropy_shard_backward(Tensor dlogits, const Tensor& logits, const Tensor& targets,
                                  const Tensor& lse, int64_t vocab_start, int64_t ignore_index,
                                  float grad_scale);

// Raw byte copy of a host buffer of dst.nbytes() bytes into dst (any dtype).
void copy_bytes_from_host(Tensor dst, const void* src);
// Raw byte copy of src (any dtype) into a host buffer of src.nbytes() bytes.
void copy_bytes_to_host(const Tensor& src, void* dst);
// A tensor with host tensor `host`'s contents on `device`: `host` itself (no
// copy) when `device` is the host. Loads host-built tables onto the device.
Tensor to_device(const Tensor& host, Device device);
// dst <- the bytes of host tensor `src` (same dtype and size); nothing when
// they are one tensor (a CPU run's batch is filled in place).
void upload(Tensor dst, const Tensor& src);
// Number of entries of an i32 tensor that differ from `value` (e.g. targets
// that are not the ignore index).
int64_t count_not_equal(const Tensor& x, int64_t value);
// Waits until the work queued on `device` is done (ops on a GPU return before
// their kernels finish; the CPU's are done when they return). For timing.
void synchronize(Device device);

// ---- optimizer ----
struct AdamWParams {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;            // 1-based, for bias correction
  float grad_scale = 1.f;  // multiplies g first (clipping / averaging)
};
// Over flat f32 buffers of equal size: decoupled weight decay, bias-corrected
// moments. If param_copy is defined (bf16 or f32) it receives the new params
// in its dtype in the same pass (the compute-dtype weights).
void adamw_step(Tensor param, const Tensor& grad, Tensor m, Tensor v, const AdamWParams& p,
                Tensor param_copy = Tensor());
// The same step with its state in reduced precision (train/adamw.h's
// optim.* keys); everything is computed in f32 and rounded once on store.
// master: f32 [n] (param_copy as above), or bf16 [n], the compute weights
// themselves (param_copy undefined). remainder: with a bf16 master, the low
// 16 bits its f32 value lost (a bf16-typed 16-bit container; bf16_master_split)
// or undefined for a plain bf16 master that rounds every update away.
// m, v: f32, bf16 (round to nearest even) or f16 [n], one dtype. f16 holds
// m / scales[0] and sqrt(v) / scales[1], scales (f32 [2], updated in place)
// powers of two putting the largest magnitude at most 2^15 (see the kernel).
void adamw_step_mixed(Tensor master, Tensor remainder, const Tensor& grad, Tensor m, Tensor v,
                      Tensor scales, const AdamWParams& p, Tensor param_copy = Tensor());
// A bf16 master with its remainder (f32 [n] <-> bf16 [n] + 16-bit [n]):
// hi is the f32 value rounded to nearest (ties away from zero) and the
// remainder its low 16 bits, so join(split(x)) == x bit for bit; a remainder
// undefined joins as zero (a plain bf16 master).
void bf16_master_split(Tensor hi, Tensor remainder, const Tensor& f32);
void bf16_master_join(Tensor f32, const Tensor& hi, const Tensor& remainder);

}  // namespace nk::ops
