// Context parallelism's all-gather variant (parallel.cp_comm_type=all_gather;
// see nn/context_parallel.h): the whole row's keys and values on every rank.
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "nn/context_parallel.h"

namespace nk::nn {
namespace {

// [B, T, W] as the rows [B T, W] that the column copies take.
Tensor gather_rows2(const Tensor& t) {
  return t.view({t.dim(0) * t.dim(1), t.dim(2)});
}

}  // namespace

void ContextParallel::prepare_gather(const Tensor& qkv, int64_t n_head, int64_t n_kv_head) const {
  GatherScratch& g = *gather;
  const int64_t n = size(), B = qkv.dim(0), Tl = qkv.dim(1);
  const int64_t D = qkv.dim(2) / (n_head + 2 * n_kv_head), kvw = 2 * n_kv_head * D, ow = n_head * D,
                T = Tl * n;
  NK_CHECK(Tl % 2 == 0, "context parallel: {} local tokens are not two chunks", Tl);
  if (g.B == B && g.T == Tl && g.kv_width == kvw && g.out_width == ow && g.dtype == qkv.dtype() &&
      g.keys.numel() == T)
    return;
  g = GatherScratch();
  g.B = B;
  g.T = Tl;
  g.kv_width = kvw;
  g.out_width = ow;
  g.dtype = qkv.dtype();
  g.positions = Tensor::empty({Tl}, DType::I32);
  for (int64_t t = 0; t < Tl; ++t)
    g.positions.data<int32_t>()[t] = int32_t(cp_global_position(t, rank(), n, Tl / 2));
  g.keys = Tensor::empty({T}, DType::I32);
  for (int64_t t = 0; t < T; ++t) g.keys.data<int32_t>()[t] = int32_t(t);
  const DType dt = qkv.dtype();
  g.mine = Tensor::empty({B, Tl, kvw}, dt);
  g.blocks = Tensor::empty({n, B, Tl, kvw}, dt);
  g.kv = Tensor::empty({B, T, kvw}, dt);
  g.dkv = Tensor::empty({B, T, kvw}, DType::F32);
  g.dblocks = Tensor::empty({n, B, Tl, kvw}, DType::F32);
  g.dmine = Tensor::empty({B, Tl, kvw}, DType::F32);
  g.out = Tensor::empty({B, Tl, ow}, DType::F32);
  if (dt != DType::F32) {
    g.cast_q = Tensor::empty({B, Tl, ow}, dt);
    g.cast_kv = Tensor::empty({B, Tl, kvw}, dt);
  }
}

void ContextParallel::gather_kv(const Tensor& qkv) const {
  GatherScratch& g = *gather;
  const int64_t n = size(), B = g.B, Tl = g.T, T = Tl * n;
  const size_t row = size_t(g.kv_width) * dtype_size(g.dtype);
  ops::copy_columns(gather_rows2(g.mine), gather_rows2(qkv), g.out_width, 1.f);
  comm->all_gather(g.mine, g.blocks);
  // Block (s, b, t) is rank s's row b, local token t: to its global position.
  const char* from = static_cast<const char*>(g.blocks.raw());
  char* to = static_cast<char*>(g.kv.raw());
  for (int64_t s = 0; s < n; ++s)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < Tl; ++t)
        std::memcpy(to + size_t(b * T + cp_global_position(t, s, n, Tl / 2)) * row,
                    from + size_t((s * B + b) * Tl + t) * row, row);
}

void ContextParallel::ag_forward(Tensor out, Tensor lse, const Tensor& qkv, int64_t n_head,
                                 int64_t n_kv_head, const Tensor& cu_seqlens, int64_t window,
                                 float scale, float softcap) const {
  prepare_gather(qkv, n_head, n_kv_head);
  GatherScratch& g = *gather;
  gather_kv(qkv);
  cp_document_starts(g.qstart, cu_seqlens, g.positions);
  ops::fill(g.out, 0.f);
  ops::fill(lse, -INFINITY);
  ops::attention_block_forward(g.out, lse, qkv, g.kv, g.positions, g.keys, n_head, n_kv_head,
                               window, g.qstart, scale, softcap);
  ops::convert(out, g.out);
}

void ContextParallel::ag_backward(Tensor dqkv, const Tensor& dout, const Tensor& qkv,
                                  const Tensor& out, const Tensor& lse, int64_t n_head,
                                  int64_t n_kv_head, const Tensor& cu_seqlens, int64_t window,
                                  float scale, float softcap) const {
  prepare_gather(qkv, n_head, n_kv_head);
  GatherScratch& g = *gather;
  const int64_t n = size(), B = g.B, Tl = g.T, T = Tl * n;
  gather_kv(qkv);  // the forward's copy went to the next layer
  cp_document_starts(g.qstart, cu_seqlens, g.positions);
  Tensor& dq = g.out;  // the forward's running output is free now
  ops::fill(dq, 0.f);
  ops::fill(g.dkv, 0.f);
  ops::attention_block_backward(dq, g.dkv, dout, out, lse, qkv, g.kv, g.positions, g.keys, n_head,
                                n_kv_head, window, g.qstart, scale, softcap);
  // Each key's gradient back in its owner's block, summed over the ranks there.
  const size_t row = size_t(g.kv_width) * sizeof(float);
  const char* from = static_cast<const char*>(g.dkv.raw());
  char* to = static_cast<char*>(g.dblocks.raw());
  for (int64_t s = 0; s < n; ++s)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < Tl; ++t)
        std::memcpy(to + size_t((s * B + b) * Tl + t) * row,
                    from + size_t(b * T + cp_global_position(t, s, n, Tl / 2)) * row, row);
  comm->reduce_scatter(g.dblocks, g.dmine);
  Tensor gq = dq, gkv = g.dmine;
  if (dqkv.dtype() != DType::F32) {
    ops::convert(g.cast_q, dq);
    ops::convert(g.cast_kv, g.dmine);
    gq = g.cast_q;
    gkv = g.cast_kv;
  }
  ops::fill(dqkv, 0.f);
  ops::add_columns(gather_rows2(dqkv), gather_rows2(gq), 0, 1.f);
  ops::add_columns(gather_rows2(dqkv), gather_rows2(gkv), g.out_width, 1.f);
}

}  // namespace nk::nn
