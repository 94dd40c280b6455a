// Attention of new tokens over a paged KV cache (decode and ragged prefill):
// CPU kernels, arguments checked by ops/kv_attention.cc.
//
// One task per (tile, kv head), a tile one new token or up to 16
// consecutive tokens of a prefill run: the tile's tokens and the group's G
// query heads share each cache row as it streams by, so a decode step reads
// every cached k and v of a head once, a block's run of positions at a time. With fewer such pairs
// than threads (a single sequence's decode under multi-query attention or MLA's latent cache: one
// kv head), each pair's query heads are cut into runs, one task each (ops/kv_attention_split.h):
// the same bits for any thread count. Scores are held for the token's whole visible span ([G,
// pos+1] fp32, or its last `window` positions; grow-only per-thread scratch), then an exact
// two-pass softmax (max, then exp-sum) and the weighted sum of v rows. Work per token is linear in
// its span (a scale other than 1/sqrt(D) and Gemma 2's soft-capping of the scores go in before the
// softmax); tasks are dealt round-robin to the threads so that a prefill, whose later tokens see
// more keys, splits evenly. The arithmetic does not depend on the block size: a paged cache gives
// the contiguous cache's bits. The cache may hold k and v in a narrower dtype than the compute one
// (kv_cache_dtype: bf16 or f16 under f32): rows are rounded once when stored and widened to fp32 as
// they stream by (load_row), so a decode step reads half the bytes. A q8_0
// cache (u8 rows of ggml's Q8_0 blocks, 34 bytes per 32 values) is quantised
// once when stored (quantize_q8_0, ops/cpu/quant.cc) and dequantised row by
// row as it streams by: 0.53 of a bf16 cache's bytes.
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

// Dot product in kLanes independent partial sums, so GCC vectorizes it
// without reassociating (no -ffast-math).
inline float dot(const float* a, const float* b, int64_t n) {
  constexpr int kL = sm::kLanes;
  float acc[kL] = {};
  int64_t c = 0;
  for (; c + kL <= n; c += kL)
    for (int u = 0; u < kL; ++u) acc[u] += a[c + u] * b[c + u];
  for (; c < n; ++c) acc[0] += a[c] * b[c];
  float s = 0;
  for (int u = 0; u < kL; ++u) s += acc[u];
  return s;
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

// Calls f(i, row) for i = 0..len-1 with the cache row (D values) of kv head
// kvh of sequence q at position first + i, a block's run of rows at a time.
// A run is one page or so (16 rows of 64 floats: 4 KiB) and the hardware
// prefetcher does not follow into the next block, which is elsewhere: each
// row fetches the matching row of the next block ahead (measured: 16-row
// blocks took ~1.4x the contiguous layout's time without it). One division
// per call, none per run.
template <typename C, typename F>
void for_each_row(const C* cache, const CacheDims& d, int64_t q, int64_t kvh, int64_t first,
                  int64_t len, F&& f) {
  const int32_t* blocks = d.table + q * d.M;
  const int64_t row_bytes = d.W * int64_t(sizeof(C));
  auto base = [&](int64_t b) { return cache + (int64_t(blocks[b]) * d.Hkv + kvh) * d.B * d.W; };
  int64_t b = first / d.B, off = first % d.B;
  for (int64_t j = 0; j < len; ++b, off = 0) {
    const int64_t e = std::min(len, j + d.B - off);  // the rest of block b, contiguous
    const C* run = base(b) + off * d.W;
    const char* next = e < len ? reinterpret_cast<const char*>(base(b + 1)) : nullptr;
    for (int64_t i = j; i < e; ++i) {
      if (next)
        for (int64_t c = 0; c < row_bytes; c += 64)
          __builtin_prefetch(next + (i - j) * row_bytes + c);
      f(i, run + (i - j) * d.W);
    }
    j = e;
  }
}

// Token n sees positions [first, pos[n]]: first = pos[n] - window + 1 (>= 0)
// under a sliding window, else 0.
//
// A prefill chunk's tokens are consecutive positions of one sequence and
// read the same rows: they are taken in tiles (kv_attention_tiles) of up to
// kTileTokens, and each row a tile's pair streams serves every token of the
// tile that sees it, so a chunk of P tokens reads the cache about P / 16
// times instead of P (a 4096-token prompt spent 34 of its 55 s here when
// every token streamed its own rows). A token's scores, softmax and
// weighted sum are the same operations in the same order whichever tile
// holds it: the output is the untiled kernel's, bit for bit.
constexpr int64_t kTileTokens = 16;
constexpr int64_t kTileScores = int64_t(1) << 20;  // floats of scores per thread, at most

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
    // q, o [most, G, D]; s [most, G, max_len]; row [D]
    float* q = scratch(size_t(most * G * (2 * D + max_len) + D));
    float* o = q + most * G * D;
    float* s = o + most * G * D;
    float* row = s + most * G * max_len;
    for (int64_t th = tb; th < te; ++th)
      for (int64_t task = th; task < tasks; task += nt) {
        const int64_t pair = task / split.runs, run = task % split.runs;
        const Tile tile = tiles[size_t(pair / d.Hkv)];
        const int64_t kvh = pair % d.Hkv, K = tile.count, n0 = tile.n0;
        // This task's query heads of the group: [g0, g1).
        const int64_t g0 = run * split.run_heads, g1 = std::min(G, g0 + split.run_heads);
        // Token t = n0 + k sees [first_of(t), pos[t]]: the tile's rows are the
        // union, from its first token's first to its last token's position.
        const int64_t ufirst = first_of(n0), ulen = int64_t(pos[n0 + K - 1]) + 1 - ufirst;
        auto qs = [&](int64_t k, int64_t g) { return q + (k * G + g) * D; };
        auto ss = [&](int64_t k, int64_t g) { return s + (k * G + g) * max_len; };
        for (int64_t k = 0; k < K; ++k)
          for (int64_t g = g0; g < g1; ++g)
            for (int64_t c = 0; c < D; ++c)
              qs(k, g)[c] = scale * to_f32(qkv[(n0 + k) * d.row() + (kvh * G + g) * D + c]);
        // Streams the tile's rows of `cache`: row holds position p's values
        // widened, then fn(k, j) for each token k of the tile that sees p
        // (those at or past it whose window reaches back to it), j = p's
        // index among the positions token k sees.
        auto stream = [&](const C* cache, auto&& fn) {
          for_each_row(cache, d, seq[n0], kvh, ufirst, ulen, [&](int64_t i, const C* r) {
            const int64_t p = ufirst + i, k_lo = std::max<int64_t>(0, p - int64_t(pos[n0]));
            int64_t k_hi = K;
            if (window > 0)
              while (k_hi > k_lo && first_of(n0 + k_hi - 1) > p) --k_hi;
            load_row(row, r, D);
            for (int64_t k = k_lo; k < k_hi; ++k) fn(k, p - first_of(n0 + k));
          });
        };
        stream(kc, [&](int64_t k, int64_t j) {
          for (int64_t g = g0; g < g1; ++g) ss(k, g)[j] = dot(qs(k, g), row, D);
        });
        for (int64_t k = 0; k < K; ++k) {
          const int64_t len = int64_t(pos[n0 + k]) + 1 - first_of(n0 + k);
          for (int64_t g = g0; g < g1; ++g) {
            float* sg = ss(k, g);
            if (softcap > 0.f)  // Gemma 2: cap tanh(s / cap) before the softmax
              for (int64_t j = 0; j < len; ++j) sg[j] = softcap * std::tanh(sg[j] / softcap);
            const float m = sm::max_of(sg, len);
            const float inv = 1.f / sm::sum_exp_shifted(sg, len, m, sg);
            for (int64_t j = 0; j < len; ++j) sg[j] *= inv;
            std::fill(o + (k * G + g) * D, o + (k * G + g + 1) * D, 0.f);
          }
        }
        stream(vc, [&](int64_t k, int64_t j) {
          for (int64_t g = g0; g < g1; ++g) {
            const float pr = ss(k, g)[j];
            float* og = o + (k * G + g) * D;
            for (int64_t c = 0; c < D; ++c) og[c] += pr * row[c];
          }
        });
        for (int64_t k = 0; k < K; ++k)
          for (int64_t g = g0; g < g1; ++g)
            for (int64_t c = 0; c < D; ++c)
              out[(n0 + k) * d.Hq * D + (kvh * G + g) * D + c] =
                  from_f32<T>(o[(k * G + g) * D + c]);
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
