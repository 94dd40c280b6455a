// Attention of new tokens over a paged KV cache (decode and ragged prefill):
// CPU kernels, arguments checked by ops/kv_attention.cc.
//
// One task per (tile, kv head), a tile one new token or up to 16
// consecutive tokens of a prefill run: the tile's tokens and the group's G
// query heads share each cache row as it streams by, so a decode step reads
// every cached k and v of a head once, a block's run of positions at a
// time, and a tile's rows meet the cache as two small matrix products
// (tile_gemm, the flash-attention kernels' micro-kernel). With fewer such
// pairs than threads (a single sequence's decode under multi-query attention
// or MLA's latent cache: one kv head), each pair's query heads are cut into
// runs, one task each (ops/kv_attention_split.h): the same bits for any
// thread count. Scores are held for the token's whole visible span ([G,
// pos+1] fp32, or its last `window` positions; grow-only per-thread
// scratch), then an exact two-pass softmax (max, then exp-sum) and the
// weighted sum of v rows. Work per token is linear in its span (a scale
// other than 1/sqrt(D) and Gemma 2's soft-capping of the scores go in
// before the softmax); tasks are dealt round-robin to the threads so that a
// prefill, whose later tokens see more keys, splits evenly. The arithmetic
// does not depend on the block size: a paged cache gives the contiguous
// cache's bits. The cache may hold k and v in a narrower dtype than the
// compute one (kv_cache_dtype: bf16 or f16 under f32): rows are rounded
// once when stored and widened to fp32 as they stream by (load_row), so a
// decode step reads half the bytes. A q8_0 cache (u8 rows of ggml's Q8_0
// blocks, 34 bytes per 32 values) is quantised once when stored
// (quantize_q8_0, ops/cpu/quant.cc) and dequantised row by row as it
// streams by: 0.53 of a bf16 cache's bytes.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/parallel.h"
#include "ops/cpu/float_io.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/level.h"
#include "ops/cpu/quant_blocks.h"
#include "ops/cpu/softmax_math.h"
#include "ops/cpu/tile_gemm.h"
#include "ops/kv_attention_split.h"
#include "ops/ops.h"

namespace nk::ops::NK_CPU_NS {
namespace {

namespace sm = softmax;

struct CacheDims {
  int64_t N, Hq, Hkv, D, NB, B;  // tokens, heads, head dim, blocks, positions per block
  int64_t Q, M;                  // block table [Q, M]
  const int32_t* table;
  int64_t W;  // a cache row's elements: D, or a q8_0 row's bytes
  int64_t group() const { return Hq / Hkv; }
  int64_t row() const { return (Hq + 2 * Hkv) * D; }
  // Offset of (sequence q, kv head, position p) in a layer's cache.
  int64_t at(int64_t q, int64_t kvh, int64_t p) const {
    return ((table[q * M + p / B] * Hkv + kvh) * B + p % B) * W;
  }
};

// The dims of the (checked) arguments, after validating each token's
// sequence, position and every block it reads: they come from the
// scheduler's data.
CacheDims dims_of(const char* op, const Tensor& qkv, const Tensor& k_cache, int64_t hq,
                  const Tensor& table, const Tensor& seqs, const Tensor& positions) {
  CacheDims d{
      rows_of(qkv),   hq,           k_cache.dim(1), kv_cache_head_dim(k_cache), k_cache.dim(0),
      k_cache.dim(2), table.dim(0), table.dim(1),   table.data<int32_t>(),      k_cache.dim(3)};
  const int32_t *sq = seqs.data<int32_t>(), *ps = positions.data<int32_t>();
  for (int64_t n = 0; n < d.N; ++n) {
    if (sq[n] < 0 || sq[n] >= d.Q)
      fail("{}: token {} names sequence {}, outside the block table's [0, {})", op, n, sq[n], d.Q);
    if (ps[n] < 0 || ps[n] >= d.M * d.B)
      fail("{}: token {} is at position {}, outside the cache's [0, {})", op, n, ps[n], d.M * d.B);
    for (int64_t j = 0; j <= ps[n] / d.B; ++j) {
      const int32_t blk = d.table[sq[n] * d.M + j];
      if (blk < 0 || blk >= d.NB)
        fail("{}: token {} (sequence {}, position {}) reads block {}, outside [0, {})", op, n,
             sq[n], ps[n], blk, d.NB);
    }
  }
  return d;
}

float* scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// A q8_0 row back to D floats (load_row's overload for the u8 cache).
using NK_CPU_NS::load_row;
inline void load_row(float* dst, const uint8_t* src, int64_t n) {
  dequant_q8_0(reinterpret_cast<const BlockQ8_0*>(src), n / kQK, dst);
}

// The cache's dtype C may differ from the compute dtype T (a bf16 or f16
// cache under f32 compute): each value is rounded to C on the way in; a
// q8_0 row (C = uint8_t) is quantised from the row widened to fp32.
template <typename T, typename C>
void store_impl(C* kc, C* vc, const T* qkv, const int32_t* seq, const int32_t* pos,
                const CacheDims& d) {
  auto put = [&](C* dst, const T* src, float* row) {
    if constexpr (std::is_same_v<C, uint8_t>) {
      load_row(row, src, d.D);
      quantize_q8_0(row, d.D, reinterpret_cast<BlockQ8_0*>(dst));
    } else if constexpr (std::is_same_v<T, C>) {
      std::copy(src, src + d.D, dst);
    } else {
      for (int64_t c = 0; c < d.D; ++c) dst[c] = store<C>(load(src[c]));
    }
  };
  parallel_for(d.N, 16, [&](int64_t b, int64_t e) {
    float* row = std::is_same_v<C, uint8_t> ? scratch(size_t(d.D)) : nullptr;
    for (int64_t n = b; n < e; ++n)
      for (int64_t h = 0; h < d.Hkv; ++h) {
        const T* src = qkv + n * d.row() + (d.Hq + h) * d.D;
        put(kc + d.at(seq[n], h, pos[n]), src, row);
        put(vc + d.at(seq[n], h, pos[n]), src + d.Hkv * d.D, row);
      }
  });
}

// Calls f(i, n, rows) for the cache rows of kv head kvh of sequence q at
// positions first + i .. first + i + n - 1 (D values each, W elements
// apart), i running over [0, len) in runs of at most `most` rows that do not
// cross a block. The hardware prefetcher does not follow into the next
// block, which is elsewhere: the rows up to kAheadRows past each run are
// prefetched before it is handed over (measured: 16-row blocks took ~1.4x
// the contiguous layout's time without it).
constexpr int64_t kAheadRows = 32;

template <typename C, typename F>
void for_each_run(const C* cache, const CacheDims& d, int64_t q, int64_t kvh, int64_t first,
                  int64_t len, int64_t most, F&& f) {
  const int32_t* blocks = d.table + q * d.M;
  const int64_t row_bytes = d.W * int64_t(sizeof(C));
  // The run at index i, at most `cap` rows: its rows and its length.
  auto run_at = [&](int64_t i, int64_t cap) {
    const int64_t p = first + i, off = p % d.B;
    const C* block = cache + (int64_t(blocks[p / d.B]) * d.Hkv + kvh) * d.B * d.W;
    return std::pair(block + off * d.W, std::min({len - i, d.B - off, cap}));
  };
  int64_t fetched = 0;  // rows [0, fetched) prefetched
  for (int64_t i = 0; i < len;) {
    const auto [rows, n] = run_at(i, most);
    for (const int64_t to = std::min(len, i + n + kAheadRows); fetched < to;) {
      const auto [ahead, an] = run_at(fetched, to - fetched);
      const char* bytes = reinterpret_cast<const char*>(ahead);
      for (int64_t c = 0; c < an * row_bytes; c += 64) __builtin_prefetch(bytes + c);
      fetched += an;
    }
    f(i, n, rows);
    i += n;
  }
}

// Token n sees positions [first, pos[n]]: first = pos[n] - window + 1 (>= 0)
// under a sliding window, else 0.
//
// A prefill chunk's tokens are consecutive positions of one sequence and
// read the same rows: they are taken in tiles (kv_attention_tiles) of up to
// kTileTokens, and a tile's M = tokens x query heads rows meet the cache in
// two small matrix products a run of rows at a time (tile_gemm): scores
// S^T[run, M] = K[run, D] Q^T[D, M], then O[M, D] += P[M, run] V[run, D].
// A token's rows see the tile's whole span; what it must not see (later
// positions, those behind its window) is left out of its softmax and given
// probability 0, which adds nothing to its weighted sum. Each score and
// each output value is one FMA chain in order (over d, then over the
// positions), whatever the tile, the run or the thread: a token gives the
// same bits alone as in any tile, paged as contiguous.
constexpr int64_t kTileTokens = 16;
constexpr int64_t kTileScores = int64_t(1) << 20;  // floats of scores per thread, at most
constexpr int64_t kRunRows = 64;                   // cache rows per product, at most

struct Tile {
  int64_t n0, count;  // tokens [n0, n0 + count)
};

// Runs of consecutive tokens of one sequence at consecutive positions, cut
// at `most` tokens.
std::vector<Tile> kv_attention_tiles(const int32_t* seq, const int32_t* pos, int64_t N,
                                     int64_t most) {
  std::vector<Tile> tiles;
  for (int64_t n = 0; n < N; ++n) {
    if (!tiles.empty()) {
      Tile& t = tiles.back();
      const int64_t last = t.n0 + t.count - 1;
      if (t.count < most && seq[n] == seq[last] && pos[n] == pos[last] + 1) {
        ++t.count;
        continue;
      }
    }
    tiles.push_back({n, 1});
  }
  return tiles;
}

// A run of n cache rows as fp32 [n, D] with rows `ld` apart: an f32 cache's
// own rows, else widened (or dequantised) into buf.
template <typename C>
const float* rows_f32(const C* rows, int64_t n, const CacheDims& d, float* buf, int64_t& ld) {
  if constexpr (std::is_same_v<C, float>) {
    ld = d.W;
    return rows;
  } else {
    ld = d.D;
    for (int64_t i = 0; i < n; ++i) load_row(buf + i * d.D, rows + i * d.W, d.D);
    return buf;
  }
}

template <typename T, typename C>
void attend_impl(T* out, const T* qkv, const C* kc, const C* vc, const int32_t* seq,
                 const int32_t* pos, int64_t window, float scale, float softcap,
                 const CacheDims& d) {
  const int64_t G = d.group(), D = d.D;
  int64_t max_len = 0;
  for (int64_t n = 0; n < d.N; ++n) max_len = std::max<int64_t>(max_len, pos[n] + 1);
  // Tiles as wide as the scores of a tile's heads allow (a latent cache has
  // every query head on its one row).
  const int64_t most = std::clamp<int64_t>(kTileScores / (G * max_len), 1, kTileTokens);
  const std::vector<Tile> tiles = kv_attention_tiles(seq, pos, d.N, most);
  const int64_t TN = int64_t(tiles.size());
  const KvAttentionSplit split = kv_attention_split(TN * d.Hkv, G, num_threads());
  const int64_t tasks = TN * d.Hkv * split.runs;
  if (scale == 0.f) scale = 1.f / std::sqrt(float(D));
  auto first_of = [&](int64_t n) {
    return window > 0 ? std::max<int64_t>(0, pos[n] - window + 1) : int64_t(0);
  };
  const int64_t nt = std::min<int64_t>(num_threads(), tasks);
  parallel_for(nt, 1, [&](int64_t tb, int64_t te) {
    const int64_t MM = most * G;  // a tile's rows, at most
    // qt [D, MM]; s [MM, max_len]; st [kRunRows, MM]; o [MM, D]; rows [kRunRows, D]
    float* qt = scratch(size_t(MM * (2 * D + max_len + kRunRows) + kRunRows * D));
    float* s = qt + D * MM;
    float* st = s + MM * max_len;
    float* o = st + kRunRows * MM;
    float* buf = o + MM * D;
    for (int64_t th = tb; th < te; ++th)
      for (int64_t task = th; task < tasks; task += nt) {
        const int64_t pair = task / split.runs, run = task % split.runs;
        const Tile tile = tiles[size_t(pair / d.Hkv)];
        const int64_t kvh = pair % d.Hkv, K = tile.count, n0 = tile.n0;
        // This task's query heads of the group: [g0, g1); row m = k * GR + g - g0
        // holds token n0 + k's head g.
        const int64_t g0 = run * split.run_heads, g1 = std::min(G, g0 + split.run_heads);
        const int64_t GR = g1 - g0, M = K * GR;
        // Token t = n0 + k sees [first_of(t), pos[t]]: the tile's rows are the
        // union, from its first token's first to its last token's position.
        const int64_t ufirst = first_of(n0), ulen = int64_t(pos[n0 + K - 1]) + 1 - ufirst;
        for (int64_t k = 0; k < K; ++k)
          for (int64_t g = g0; g < g1; ++g)
            for (int64_t c = 0; c < D; ++c)
              qt[c * M + k * GR + g - g0] =
                  scale * to_f32(qkv[(n0 + k) * d.row() + (kvh * G + g) * D + c]);
        for_each_run(kc, d, seq[n0], kvh, ufirst, ulen, kRunRows,
                     [&](int64_t i, int64_t n, const C* rows) {
                       int64_t ld;
                       const float* kr = rows_f32(rows, n, d, buf, ld);
                       tile_gemm(n, M, D, kr, ld, qt, M, st, M, false);
                       for (int64_t m = 0; m < M; ++m)
                         for (int64_t r = 0; r < n; ++r) s[m * ulen + i + r] = st[r * M + m];
                     });
        for (int64_t k = 0; k < K; ++k) {
          const int64_t lo = first_of(n0 + k) - ufirst, hi = int64_t(pos[n0 + k]) + 1 - ufirst;
          for (int64_t m = k * GR; m < (k + 1) * GR; ++m) {
            float* srow = s + m * ulen;
            float* sg = srow + lo;
            const int64_t len = hi - lo;
            if (softcap > 0.f)  // Gemma 2: cap tanh(s / cap) before the softmax
              for (int64_t j = 0; j < len; ++j) sg[j] = softcap * std::tanh(sg[j] / softcap);
            const float mx = sm::max_of(sg, len);
            const float inv = 1.f / sm::sum_exp_shifted(sg, len, mx, sg);
            for (int64_t j = 0; j < len; ++j) sg[j] *= inv;
            std::fill(srow, sg, 0.f);
            std::fill(srow + hi, srow + ulen, 0.f);
          }
        }
        std::fill(o, o + M * D, 0.f);
        for_each_run(vc, d, seq[n0], kvh, ufirst, ulen, kRunRows,
                     [&](int64_t i, int64_t n, const C* rows) {
                       int64_t ld;
                       const float* vr = rows_f32(rows, n, d, buf, ld);
                       tile_gemm(M, D, n, s + i, ulen, vr, ld, o, D, true);
                     });
        for (int64_t k = 0; k < K; ++k)
          for (int64_t g = g0; g < g1; ++g)
            for (int64_t c = 0; c < D; ++c)
              out[(n0 + k) * d.Hq * D + (kvh * G + g) * D + c] =
                  from_f32<T>(o[(k * GR + g - g0) * D + c]);
      }
  });
}

// fn(T{}, C{}): T the compute dtype (f32, bf16), C the cache's (f32, bf16,
// f16, or uint8_t for q8_0 rows).
template <typename Fn>
void dispatch_kv(const Tensor& qkv, const Tensor& cache, const char* op, Fn&& fn) {
  auto with_t = [&](auto c) {
    if (qkv.dtype() == DType::F32)
      fn(float{}, c);
    else
      fn(bf16{}, c);
  };
  if (cache.dtype() == DType::U8)
    with_t(uint8_t{});
  else
    dispatch_float(cache.dtype(), op, with_t);
}

}  // namespace

void kv_cache_store(Tensor k_cache, Tensor v_cache, const Tensor& qkv, int64_t n_q_heads,
                    const Tensor& block_table, const Tensor& seqs, const Tensor& positions) {
  const CacheDims d =
      dims_of("kv_cache_store", qkv, k_cache, n_q_heads, block_table, seqs, positions);
  const int32_t *sq = seqs.data<int32_t>(), *ps = positions.data<int32_t>();
  dispatch_kv(qkv, k_cache, "kv_cache_store", [&](auto t, auto c) {
    using T = decltype(t);
    using C = decltype(c);
    store_impl(k_cache.data<C>(), v_cache.data<C>(), qkv.data<T>(), sq, ps, d);
  });
}

void attention_cached(Tensor out, const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                      int64_t n_q_heads, const Tensor& block_table, const Tensor& seqs,
                      const Tensor& positions, int64_t window, float scale, float softcap) {
  const CacheDims d =
      dims_of("attention_cached", qkv, k_cache, n_q_heads, block_table, seqs, positions);
  const int32_t *sq = seqs.data<int32_t>(), *ps = positions.data<int32_t>();
  dispatch_kv(qkv, k_cache, "attention_cached", [&](auto t, auto c) {
    using T = decltype(t);
    using C = decltype(c);
    attend_impl(out.data<T>(), qkv.data<T>(), k_cache.data<C>(), v_cache.data<C>(), sq, ps, window,
                scale, softcap, d);
  });
}

}  // namespace nk::ops::NK_CPU_NS
