// Attention of new tokens over a (paged) KV cache: checks, then the device's
// kernel. Block tables, sequences and positions are data, checked by the
// kernel that reads them.
#include <cmath>

#include "ops/dispatch.h"
#include "ops/ops.h"

namespace nk::ops {
namespace {

// Shapes and dtypes shared by both ops; returns the device.
Device check_args(const char* op, const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                  int64_t hq, const Tensor& table, const Tensor& seqs, const Tensor& positions,
                  const Tensor& out) {
  const Device dev = device_of(op, {{&qkv, "qkv"},
                                    {&k_cache, "k_cache"},
                                    {&v_cache, "v_cache"},
                                    {&table, "block_table"},
                                    {&seqs, "seqs"},
                                    {&positions, "positions"},
                                    {&out, "out", kOptional}});
  NK_CHECK(qkv.dtype() == DType::F32 || qkv.dtype() == DType::BF16, "{}: dtype {}", op,
           dtype_name(qkv.dtype()));
  NK_CHECK(k_cache.ndim() == 4, "{}: k_cache {} must be [NB, Hkv, B, D]", op, k_cache.desc());
  check_shape(v_cache, k_cache.shape(), "v_cache");
  // The cache may be narrower than the compute dtype (a bf16 or f16 cache
  // under f32 compute, or q8_0 rows); k and v alike.
  const DType kv = k_cache.dtype();
  NK_CHECK(kv == DType::F32 || kv == DType::BF16 || kv == DType::F16 || kv == DType::U8,
           "{}: k_cache dtype {} (f32, bf16, f16 or u8 for q8_0)", op, dtype_name(kv));
  check_dtype(v_cache, kv, "v_cache");
  const int64_t n = rows_of(qkv), hkv = k_cache.dim(1), D = kv_cache_head_dim(k_cache);
  NK_CHECK(hq > 0 && hkv > 0 && hq % hkv == 0, "{}: {} query heads, {} kv heads", op, hq, hkv);
  NK_CHECK(qkv.dim(-1) == (hq + 2 * hkv) * D, "{}: qkv {} is not [N, (Hq+2*Hkv)*D] = [N, {}]", op,
           qkv.desc(), (hq + 2 * hkv) * D);
  NK_CHECK(table.ndim() == 2 && table.dim(1) > 0, "{}: block_table {} must be [Q, M]", op,
           table.desc());
  check_dtype(table, DType::I32, "block_table");
  check_dtype(seqs, DType::I32, "seqs");
  check_dtype(positions, DType::I32, "positions");
  NK_CHECK(seqs.numel() == n && positions.numel() == n,
           "{}: seqs {} and positions {} need one entry per token ({})", op, seqs.desc(),
           positions.desc(), n);
  if (out.defined()) {
    check_dtype(out, qkv.dtype(), "attention_cached out");
    NK_CHECK(rows_of(out) == n && out.dim(-1) == hq * D,
             "attention_cached: out {} is not [N={}, Hq*D={}]", out.desc(), n, hq * D);
  }
  return dev;
}

}  // namespace

int64_t kv_cache_row_width(int64_t values, DType c) {
  if (c != DType::U8) return values;
  if (values <= 0 || values % kKvQ8Values)
    fail(
        "a q8_0 KV cache needs rows of a multiple of {} values (kv_cache_dtype=q8_0); this "
        "model's rows hold {} (its head_dim, or an MLA latent row)",
        kKvQ8Values, values);
  return values / kKvQ8Values * kKvQ8Bytes;
}

int64_t kv_cache_head_dim(const Tensor& k_cache) {
  const int64_t w = k_cache.dim(-1);
  if (k_cache.dtype() != DType::U8) return w;
  NK_CHECK(w > 0 && w % kKvQ8Bytes == 0, "k_cache {}: a q8_0 row is whole blocks of {} bytes",
           k_cache.desc(), kKvQ8Bytes);
  return w / kKvQ8Bytes * kKvQ8Values;
}

void kv_cache_store(Tensor k_cache, Tensor v_cache, const Tensor& qkv, int64_t n_q_heads,
                    const Tensor& block_table, const Tensor& seqs, const Tensor& positions) {
  const Device dev = check_args("kv_cache_store", qkv, k_cache, v_cache, n_q_heads, block_table,
                                seqs, positions, Tensor());
  NK_KERNEL(kv_cache_store, dev)(k_cache, v_cache, qkv, n_q_heads, block_table, seqs, positions);
}

void attention_cached(Tensor out, const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                      int64_t n_q_heads, const Tensor& block_table, const Tensor& seqs,
                      const Tensor& positions, int64_t window, float scale, float softcap) {
  NK_CHECK(out.defined(), "attention_cached: out is undefined");
  NK_CHECK(window >= 0, "attention_cached: window {} must be >= 0 (0 = full causal)", window);
  NK_CHECK(scale >= 0 && std::isfinite(scale),
           "attention_cached: scale {} must be >= 0 (0: 1/sqrt(D))", scale);
  NK_CHECK(softcap >= 0 && std::isfinite(softcap),
           "attention_cached: softcap {} must be >= 0 (0: none)", softcap);
  const Device dev = check_args("attention_cached", qkv, k_cache, v_cache, n_q_heads, block_table,
                                seqs, positions, out);
  NK_KERNEL(attention_cached, dev)
  (out, qkv, k_cache, v_cache, n_q_heads, block_table, seqs, positions, window, scale, softcap);
}

}  // namespace nk::ops
