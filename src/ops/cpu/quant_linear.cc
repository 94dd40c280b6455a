// Quantised weights on the CPU, part 2: quant_linear_forward. Few rows of x
// (decode) take the direct kernel of quant_dot.cc, which reads W's blocks;
// more rows (batched decode, prefill) take the integer tiles of
// quant_gemm.cc where the build has AVX-512 VNNI (every row count for a
// weight packed by quant_pack), and otherwise (or for W8A16 and F16) the
// panel path: W's rows dequantised 16 (AVX2) or 32 (AVX-512) at a time into
// each thread's own block and multiplied there by a register tile
// (by_blocks), in one pass of the thread pool. No path holds a dense copy of
// W; the scratch buffers grow to the largest size seen and are never shrunk.
#include <algorithm>
#include <array>
#include <utility>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "core/parallel.h"
#include "ops/cpu/float_io.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/level.h"
#include "ops/cpu/quant_blocks.h"
#include "ops/cpu/tile_gemm.h"

namespace nk::ops::NK_CPU_NS {
namespace {

// Rows of x up to which the direct kernel is faster than the panel path:
// each x row adds 0.5 to 0.9 of its one-row cost (compute, the weights being
// in L1 by then), while the panel path's cost is mostly the dequantisation
// and the tile's f32 product. bench_quant --sweep ([2048 x 2048], 1 and 2
// threads of a 2-core AVX2 machine, against the oneDNN panels the path was
// before): the direct kernels were faster up to N = 16..24 for the types
// that quantise x and up to 12..14 for W8A16 (f32 FMAs). F16, 4 x rows a
// pass: faster to N = 32 on a 2-core AVX-512 machine (1.61 against 1.80 ms
// there, 0.81 against 1.17 at 16), even with the 12 x 32 tiles at 32 on a
// Zen 5 (1.41 / 1.41 ms, 1.06 / 1.12 at 24); at the AVX2 level to about 20
// rows ([2048 x 2048], 2 threads of a Zen 3, direct / blocks: 1.8 / 2.1 ms
// at 16, 2.2 / 2.0 at 20, 2.8 / 2.0 at 24). Where the VNNI tiles exist they
// take over from N = 2 instead.
int64_t direct_rows_max(QuantType t) {
#if !defined(__AVX512F__)
  if (t == QuantType::F16 || t == QuantType::BF16) return 20;
#endif
  if (t == QuantType::F16 || t == QuantType::BF16) return 32;
  return t == QuantType::W8A16 ? 12 : 16;
}

// Rows of x from which the VNNI tiles (where the build has them) take over
// from the direct kernel: unpacking a group costs about one direct row, and
// each further row a third to a half of a direct one. bench_quant --sweep,
// [2048 x 2048], 2 threads of a 2-core AVX-512 machine (ms, direct / tiles):
// at N = 2 q8_0 0.127 / 0.109, q4_0 0.104 / 0.099, q4_k 0.093 / 0.089, q6_k
// about even (0.097 / 0.113 and 0.126 / 0.112 in two runs), w8a8 0.075 /
// 0.093 (it catches up at N = 3: 0.108 / 0.098). Above it the tiles beat
// the panels at every N measured (to 64: 3.0x for q4_0).
int64_t gemm_rows_min(QuantType t) {
  return t == QuantType::W8A8 ? 3 : 2;
}

// ---- the panel path: 16 or 32 rows of W at a time in a register tile ----
//
// y[N, out] = x[N, in] W^T + b with every sum in f32 over i = 0 .. in - 1
// in order, by one thread, so the result does not depend on the thread
// count. x is laid out R rows at a time, [ceil(N / R)][in][R] (the last
// group padded with zeros), so one tile's x values at step i are adjacent.
// A task takes C of W's rows: it dequantises them (quant_dequant_row, W's
// row scale applied) and lays them out [in][C] in its thread's block, then
// runs the tile over every group of x: at each i two vectors of W's values
// times R broadcast x values into 2 R accumulators. AVX2: R = 6, C = 16
// (12 of the 16 registers); AVX-512: R = 12, C = 32 (24 of the 32).
// Dequantising inside the task overlaps one thread's reading of W from
// memory with the other's arithmetic, which oneDNN's product on a panel
// dequantised beforehand (the path before) does not, and needs no pass of
// the pool per panel. Measured against those oneDNN panels on a 2-core Zen 3
// at AVX2 and a Zen 5 at AVX-512 (BENCHMARKS.md, the AVX2 host section and
// "Prompt processing of f16 weights at the AVX-512 levels").
#if defined(__AVX512F__)
constexpr int64_t kTileRows = 12, kBlockCols = 32;
#else
constexpr int64_t kTileRows = 6, kBlockCols = 16;
#endif

std::vector<char> g_lin_xp;

template <typename T>
void interleave_x(const T* x, int64_t n, int64_t in, float* xp) {
  const int64_t groups = (n + kTileRows - 1) / kTileRows;
  parallel_for(groups, std::max<int64_t>(1, 16384 / in), [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      float* d = xp + g * in * kTileRows;
      // (The last group's missing rows are left as they are: tile_block reads
      // a group's rows only.)
      for (int64_t r = 0; r < std::min(kTileRows, n - g * kTileRows); ++r) {
        const int64_t row = g * kTileRows + r;
        for (int64_t i = 0; i < in; ++i) d[i * kTileRows + r] = load(x[row * in + i]);
      }
    }
  });
}

// The tile's vector (tile_gemm.h): 16 lanes with AVX-512, 8 with AVX2.
using Vec = tile_gemm_detail::Vec;
constexpr int64_t kLanes = Vec::W;
static_assert(kBlockCols == 2 * kLanes);

// acc[r][c] = sum over i of xp[i][r] * block[i][c], for the first R of a
// group's kTileRows rows.
template <int R>
void tile_rows(const float* block, const float* xp, int64_t in, float* acc) {
  Vec::Reg a[R][2];
  for (auto& r : a) r[0] = r[1] = Vec::zero();
  for (int64_t i = 0; i < in; ++i) {
    const Vec::Reg w0 = Vec::load(block + i * kBlockCols),
                   w1 = Vec::load(block + i * kBlockCols + kLanes);
    const float* xi = xp + i * kTileRows;
    for (int r = 0; r < R; ++r) {
      const Vec::Reg xv = Vec::set1(xi[r]);
      a[r][0] = Vec::fmadd(xv, w0, a[r][0]);
      a[r][1] = Vec::fmadd(xv, w1, a[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    Vec::store(acc + r * kBlockCols, a[r][0]);
    Vec::store(acc + r * kBlockCols + kLanes, a[r][1]);
  }
}

template <size_t... R>
constexpr auto tile_table(std::index_sequence<R...>) {
  return std::array{&tile_rows<int(R) + 1>...};
}
// tile_rows<rows>: a group's rows alone, so the last group of a prompt
// computes only the rows it has (a 64-row prompt at 12-row tiles: 4 of the
// last, not 12 of which 8 are padding). Each output is the same sum either way.
void tile_block(const float* block, const float* xp, int64_t in, int64_t rows, float* acc) {
  static constexpr auto kTiles = tile_table(std::make_index_sequence<size_t(kTileRows)>());
  kTiles[size_t(rows - 1)](block, xp, in, acc);
}

// The 8 x 8 floats r[j][0..8) transposed: r[i][j] <- r[j][i].
inline void transpose8x8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int j = 0; j < 8; j += 2) {
    t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
    t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
  }
  for (int j = 0; j < 8; j += 4) {
    u[j] = _mm256_shuffle_ps(t[j], t[j + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// rows [C][in] -> block [in][C].
inline void to_block(const float* rows, int64_t in, float* block) {
  int64_t i = 0;
  for (; i + 8 <= in; i += 8)
    for (int64_t c0 = 0; c0 < kBlockCols; c0 += 8) {
      __m256 r[8];
      for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(rows + (c0 + j) * in + i);
      transpose8x8(r);
      for (int j = 0; j < 8; ++j) _mm256_store_ps(block + (i + j) * kBlockCols + c0, r[j]);
    }
  for (; i < in; ++i)
    for (int64_t c = 0; c < kBlockCols; ++c) block[i * kBlockCols + c] = rows[c * in + i];
}

template <typename T>
void by_blocks(Tensor y, const Tensor& x, const QuantWeight& w, const Tensor& b) {
  const int64_t n = rows_of(x), in = w.cols(), out = w.rows();
  const int64_t groups = (n + kTileRows - 1) / kTileRows;
  float* xp = scratch<float>(g_lin_xp, size_t(groups * kTileRows * in));
  interleave_x(x.data<T>(), n, in, xp);
  QuantOut<T> yo(y, w, b);
  yo.wscale = nullptr;  // applied as the rows are dequantised
  const float* scale = w.scale.defined() ? w.scale.data<float>() : nullptr;
  const int64_t blocks = (out + kBlockCols - 1) / kBlockCols;
  parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
    thread_local std::vector<char> rows_buf, block_buf;
    thread_local std::vector<uint8_t> row_bytes;
    float* rows = scratch<float>(rows_buf, size_t(kBlockCols * in));
    float* block = scratch<float>(block_buf, size_t(kBlockCols * in));
    alignas(64) float acc[kTileRows * kBlockCols];
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t o0 = blk * kBlockCols, cols = std::min(kBlockCols, out - o0);
      for (int64_t c = 0; c < kBlockCols; ++c) {
        float* r = rows + c * in;
        if (c < cols)
          quant_dequant_row(w.type, quant_row(w, o0 + c, row_bytes), scale ? scale[o0 + c] : 0.f,
                            in, r);
        else
          std::fill(r, r + in, 0.f);
      }
      to_block(rows, in, block);
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t tr = std::min(kTileRows, n - g * kTileRows);
        tile_block(block, xp + g * in * kTileRows, in, tr, acc);
        for (int64_t r = 0; r < tr; ++r)
          for (int64_t c = 0; c < cols; ++c)
            yo.store(g * kTileRows + r, o0 + c, acc[r * kBlockCols + c]);
      }
    }
  });
}

}  // namespace

const float* rows_as_f32(const Tensor& t, std::vector<char>& buf) {
  if (t.dtype() == DType::F32) return t.data<float>();
  const int64_t n = t.numel();
  float* out = scratch<float>(buf, size_t(n));
  const bf16* src = t.data<bf16>();
  parallel_for(n, 1 << 14, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = load(src[i]);
  });
  return out;
}

void quant_linear_panels(Tensor y, const Tensor& x, const QuantWeight& w, const Tensor& b) {
  // by_blocks reads x's interleaved rows (f32) once per block of W: at
  // most kBlockPassRows rows of x a pass, so that they stay in the last
  // level cache (384 rows of 8192 values are 12 MiB); W is dequantised once
  // a pass. (Prefill's chunks, 256 tokens by default, take one pass.)
  constexpr int64_t kBlockPassRows = 384;
  const int64_t n = rows_of(x), in = w.cols(), out = w.rows();
  const Tensor x2 = x.view({n, in});
  Tensor y2 = y.view({n, out});
  for (int64_t r0 = 0; r0 < n; r0 += kBlockPassRows) {
    const int64_t r = std::min(kBlockPassRows, n - r0);
    if (x.dtype() == DType::F32)
      by_blocks<float>(y2.narrow0(r0, r), x2.narrow0(r0, r), w, b);
    else
      by_blocks<bf16>(y2.narrow0(r0, r), x2.narrow0(r0, r), w, b);
  }
}

QuantPath quant_linear_path(QuantType t, int64_t in, int64_t n, QuantLayout layout) {
  if (layout == QuantLayout::Packed16) return QuantPath::Gemm;
  if (quant_gemm_available(t, in))
    return n < gemm_rows_min(t) ? QuantPath::Direct : QuantPath::Gemm;
  return n <= direct_rows_max(t) ? QuantPath::Direct : QuantPath::Panels;
}

void quant_linear_forward(Tensor y, const Tensor& x, const QuantWeight& w, const Tensor& b) {
  switch (quant_linear_path(w.type, w.cols(), rows_of(x), w.layout)) {
    case QuantPath::Direct:
      return quant_linear_direct(y, x, w, b);
    case QuantPath::Gemm:
      return quant_linear_gemm(y, x, w, b);
    case QuantPath::Panels:
      return quant_linear_panels(y, x, w, b);
  }
}

}  // namespace nk::ops::NK_CPU_NS
