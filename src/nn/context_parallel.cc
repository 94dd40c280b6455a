#include "nn/context_parallel.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace nk::nn {
namespace {

constexpr int kTagKv = 0x4350, kTagDkv = 0x4351;  // "CP"

// [B, T, W] as the rows [B T, W] that the column copies take.
Tensor rows2(const Tensor& t) {
  return t.view({t.dim(0) * t.dim(1), t.dim(2)});
}

}  // namespace

void cp_document_starts(Tensor& qstart, const Tensor& cu_seqlens, const Tensor& positions) {
  if (!cu_seqlens.defined()) {
    qstart = Tensor();
    return;
  }
  const int64_t B = cu_seqlens.dim(0), S = cu_seqlens.dim(1) - 1, T = positions.dim(0);
  if (!qstart.defined() || qstart.dim(0) != B || qstart.dim(1) != T)
    qstart = Tensor::empty({B, T}, DType::I32);
  const int32_t* pos = positions.data<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* cu = cu_seqlens.data<int32_t>() + b * (S + 1);
    int32_t* out = qstart.data<int32_t>() + b * T;
    for (int64_t t = 0; t < T; ++t) {
      // The last start at or before the token: its document [c_k, c_k+1).
      const int32_t* k = std::upper_bound(cu, cu + S, pos[t]);
      out[t] = k == cu ? 0 : *(k - 1);
    }
  }
}

void ContextParallel::prepare_ring(const Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                                   int64_t n) const {
  RingScratch& r = *ring;
  const int64_t B = qkv.dim(0), T = qkv.dim(1), D = qkv.dim(2) / (n_head + 2 * n_kv_head);
  const int64_t kvw = 2 * n_kv_head * D, ow = n_head * D;
  NK_CHECK(T % 2 == 0, "context parallel: {} local tokens are not two chunks", T);
  if (r.B == B && r.T == T && r.kv_width == kvw && r.out_width == ow && r.dtype == qkv.dtype() &&
      int64_t(r.positions.size()) == n)
    return;
  r = RingScratch();
  r.B = B;
  r.T = T;
  r.kv_width = kvw;
  r.out_width = ow;
  r.dtype = qkv.dtype();
  const int64_t c = T / 2;
  for (int64_t k = 0; k < n; ++k) {
    Tensor p = Tensor::empty({T}, DType::I32);
    for (int64_t t = 0; t < T; ++t) p.data<int32_t>()[t] = int32_t(cp_global_position(t, k, n, c));
    r.positions.push_back(p);
  }
  for (int i = 0; i < 2; ++i) {
    r.kv[i] = Tensor::empty({B, T, kvw}, qkv.dtype());
    r.dkv[i] = Tensor::empty({B, T, kvw}, DType::F32);
  }
  r.out = Tensor::empty({B, T, ow}, DType::F32);
  if (qkv.dtype() != DType::F32) {
    r.cast_q = Tensor::empty({B, T, ow}, qkv.dtype());
    r.cast_kv = Tensor::empty({B, T, kvw}, qkv.dtype());
  }
}

void ContextParallel::attention_forward(Tensor out, Tensor lse, const Tensor& qkv, int64_t n_head,
                                        int64_t n_kv_head, const Tensor& cu_seqlens, int64_t window,
                                        float scale, float softcap) const {
  if (!active()) {
    ops::attention_forward(out, lse, qkv, n_head, n_kv_head, cu_seqlens, window, scale, softcap);
    return;
  }
  switch (comm_type) {
    case CpComm::A2A:
    case CpComm::A2AP2P:
      a2a_forward(out, lse, qkv, n_head, n_kv_head, cu_seqlens, window, scale, softcap);
      return;
    case CpComm::AllGather:
      ag_forward(out, lse, qkv, n_head, n_kv_head, cu_seqlens, window, scale, softcap);
      return;
    case CpComm::P2P:
      ring_forward(*comm, out, lse, qkv, n_head, n_kv_head, cu_seqlens, window, scale, softcap);
      return;
  }
}

void ContextParallel::ring_forward(dist::Communicator& ring_comm, Tensor out, Tensor lse,
                                   const Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                                   const Tensor& cu_seqlens, int64_t window, float scale,
                                   float softcap) const {
  const int n = ring_comm.size(), me = ring_comm.rank(), next = (me + 1) % n,
            prev = (me + n - 1) % n;
  prepare_ring(qkv, n_head, n_kv_head, n);
  RingScratch& r = *ring;
  cp_document_starts(r.qstart, cu_seqlens, r.positions[size_t(me)]);
  ops::copy_columns(rows2(r.kv[0]), rows2(qkv), r.out_width, 1.f);
  ops::fill(r.out, 0.f);
  ops::fill(lse, -INFINITY);
  for (int s = 0; s < n; ++s) {
    const Tensor &cur = r.kv[s % 2], &nxt = r.kv[(s + 1) % 2];
    dist::WorkPtr recv, send;
    if (s + 1 < n) {  // the next block moves while this one is computed
      recv = ring_comm.recv_async(nxt, prev, kTagKv);
      send = ring_comm.send_async(cur, next, kTagKv);
    }
    const int owner = (me - s + n) % n;
    ops::attention_block_forward(r.out, lse, qkv, cur, r.positions[size_t(me)],
                                 r.positions[size_t(owner)], n_head, n_kv_head, window, r.qstart,
                                 scale, softcap);
    if (send) {
      send->wait();
      recv->wait();
    }
  }
  ops::convert(out, r.out);
}

void ContextParallel::attention_backward(Tensor dqkv, const Tensor& dout, const Tensor& qkv,
                                         const Tensor& out, const Tensor& lse, int64_t n_head,
                                         int64_t n_kv_head, const Tensor& cu_seqlens,
                                         int64_t window, float scale, float softcap) const {
  if (!active()) {
    ops::attention_backward(dqkv, dout, qkv, out, lse, n_head, n_kv_head, cu_seqlens, window, scale,
                            softcap);
    return;
  }
  switch (comm_type) {
    case CpComm::A2A:
    case CpComm::A2AP2P:
      a2a_backward(dqkv, dout, qkv, out, lse, n_head, n_kv_head, cu_seqlens, window, scale,
                   softcap);
      return;
    case CpComm::AllGather:
      ag_backward(dqkv, dout, qkv, out, lse, n_head, n_kv_head, cu_seqlens, window, scale, softcap);
      return;
    case CpComm::P2P:
      ring_backward(*comm, dqkv, dout, qkv, out, lse, n_head, n_kv_head, cu_seqlens, window, scale,
                    softcap);
      return;
  }
}

void ContextParallel::ring_backward(dist::Communicator& ring_comm, Tensor dqkv, const Tensor& dout,
                                    const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                    int64_t n_head, int64_t n_kv_head, const Tensor& cu_seqlens,
                                    int64_t window, float scale, float softcap) const {
  const int n = ring_comm.size(), me = ring_comm.rank(), next = (me + 1) % n,
            prev = (me + n - 1) % n;
  prepare_ring(qkv, n_head, n_kv_head, n);
  RingScratch& r = *ring;
  cp_document_starts(r.qstart, cu_seqlens, r.positions[size_t(me)]);
  const int64_t q_cols = r.out_width;
  ops::copy_columns(rows2(r.kv[0]), rows2(qkv), q_cols, 1.f);
  Tensor& dq = r.out;  // the forward's running output is free now
  ops::fill(dq, 0.f);
  ops::fill(r.dkv[0], 0.f);
  for (int s = 0; s < n; ++s) {
    const Tensor &cur = r.kv[s % 2], &nxt = r.kv[(s + 1) % 2];
    const Tensor &dcur = r.dkv[s % 2], &dnxt = r.dkv[(s + 1) % 2];
    dist::WorkPtr recv, send;
    if (s + 1 < n) {
      recv = ring_comm.recv_async(nxt, prev, kTagKv);
      send = ring_comm.send_async(cur, next, kTagKv);
    }
    const int owner = (me - s + n) % n;
    ops::attention_block_backward(dq, dcur, dout, out, lse, qkv, cur, r.positions[size_t(me)],
                                  r.positions[size_t(owner)], n_head, n_kv_head, window, r.qstart,
                                  scale, softcap);
    if (send) {
      send->wait();
      recv->wait();
    }
    // The block's gradient goes on with it; after the last step each block's
    // has been round every rank and arrives at its owner (dnxt after s = n-1).
    dist::WorkPtr drecv = ring_comm.recv_async(dnxt, prev, kTagDkv);
    dist::WorkPtr dsend = ring_comm.send_async(dcur, next, kTagDkv);
    dsend->wait();
    drecv->wait();
  }
  const Tensor& dkv = r.dkv[n % 2];
  Tensor gq = dq, gkv = dkv;
  if (dqkv.dtype() != DType::F32) {
    ops::convert(r.cast_q, dq);
    ops::convert(r.cast_kv, dkv);
    gq = r.cast_q;
    gkv = r.cast_kv;
  }
  ops::fill(dqkv, 0.f);
  ops::add_columns(rows2(dqkv), rows2(gq), 0, 1.f);
  ops::add_columns(rows2(dqkv), rows2(gkv), q_cols, 1.f);
}

int64_t ContextParallel::total(int64_t n) const {
  if (!active()) return n;
  Tensor t = Tensor::empty({1}, DType::I64);
  *t.data<int64_t>() = n;
  comm->all_reduce(t);
  return *t.data<int64_t>();
}

}  // namespace nk::nn
