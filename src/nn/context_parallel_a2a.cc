// Context parallelism's all-to-all variant (DeepSpeed-Ulysses; see
// nn/context_parallel.h): the heads, not the keys, travel; and a2a+p2p,
// the same all-to-all over the inner groups with a ring over the outer.
#include <cstring>

#include "core/error.h"
#include "nn/context_parallel.h"

namespace nk::nn {

CpComm parse_cp_comm(const std::string& s) {
  if (s == "p2p") return CpComm::P2P;
  if (s == "a2a") return CpComm::A2A;
  if (s == "all_gather") return CpComm::AllGather;
  if (s == "a2a+p2p") return CpComm::A2AP2P;
  fail(
      "parallel.cp_comm_type = '{}': expected p2p (ring attention), a2a (all-to-all, Ulysses), "
      "all_gather (keys and values gathered) or a2a+p2p (hierarchical, with "
      "parallel.hierarchical_context_parallel_sizes)",
      s);
}

const char* cp_comm_name(CpComm c) {
  switch (c) {
    case CpComm::A2A:
      return "a2a";
    case CpComm::AllGather:
      return "all_gather";
    case CpComm::A2AP2P:
      return "a2a+p2p";
    case CpComm::P2P:
      break;
  }
  return "p2p";
}

dist::Communicator& ContextParallel::head_group() const {
  if (comm_type != CpComm::A2AP2P) return *comm;
  // Group rank s of ring rank j is cp rank j a + s (dist::Mesh's hierarchical groups).
  NK_CHECK(a2a_comm && p2p_comm && a2a_comm->size() * p2p_comm->size() == comm->size() &&
               a2a_comm->rank() == comm->rank() % a2a_comm->size() &&
               p2p_comm->rank() == comm->rank() / a2a_comm->size(),
           "context parallel a2a+p2p: no hierarchical groups within the {} cp ranks", comm->size());
  return *a2a_comm;
}

void ContextParallel::prepare_heads(const Tensor& qkv, int64_t n_head, int64_t n_kv_head) const {
  HeadScratch& h = *heads;
  const dist::Communicator& group = head_group();
  const int64_t n = group.size(), B = qkv.dim(0), Tl = qkv.dim(1), W = qkv.dim(2);
  const int64_t D = W / (n_head + 2 * n_kv_head), T = Tl * n;
  NK_CHECK(Tl % 2 == 0, "context parallel: {} local tokens are not two chunks", Tl);
  // check_context_parallel refuses these with the keys' names first.
  NK_CHECK(n_head % n == 0 && n_kv_head % n == 0,
           "context parallel a2a: {} query and {} key/value heads over {} ranks", n_head, n_kv_head,
           n);
  if (h.B == B && h.T == Tl && h.qkv_width == W && h.out_width == n_head * D &&
      h.dtype == qkv.dtype() && int64_t(h.slot.size()) == T)
    return;
  h = HeadScratch();
  h.B = B;
  h.T = Tl;
  h.qkv_width = W;
  h.out_width = n_head * D;
  h.dtype = qkv.dtype();
  const DType dt = qkv.dtype();
  h.send = Tensor::empty({B * Tl * W}, dt);
  h.recv = Tensor::empty({B * Tl * W}, dt);
  h.qkv = Tensor::empty({B, T, W / n}, dt);
  h.dqkv = Tensor::empty({B, T, W / n}, dt);
  h.out = Tensor::empty({B, T, n_head * D / n}, dt);
  h.dout = Tensor::empty({B, T, n_head * D / n}, dt);
  // Head group j of p (p = 1, j = 0 under a2a) holds chunks j and 2p−1−j
  // of the row cut in 2p chunks of n Tl / 2 tokens (its ranks' chunks side
  // by side): a token's slot is its offset in the first, or past it in the
  // second.
  const int64_t p = size() / n, j = rank() / n, half = T / 2;
  h.slot.resize(size_t(T));
  for (int64_t s = 0; s < n; ++s)
    for (int64_t t = 0; t < Tl; ++t) {
      const int64_t g = cp_global_position(t, j * n + s, size(), Tl / 2);
      h.slot[size_t(s * Tl + t)] =
          g < (j + 1) * half ? g - j * half : g - (2 * p - 1 - j) * half + half;
    }
}

// Block (j, b, t) of the all-to-all buffers is rank j's (to or from) row b,
// local token t: w = W / cp values at ((j B + b) Tl + t) w.
void ContextParallel::to_heads(const Tensor& dst, const Tensor& src,
                               std::initializer_list<int64_t> seg) const {
  HeadScratch& h = *heads;
  dist::Communicator& group = head_group();
  const int64_t n = group.size(), B = src.dim(0), Tl = src.dim(1), W = src.dim(2), w = W / n;
  const int64_t T = Tl * n, e = int64_t(dtype_size(src.dtype()));
  NK_CHECK(dst.dim(0) == B && dst.dim(1) == T && dst.dim(2) == w && dst.dtype() == src.dtype(),
           "context parallel a2a: to_heads shapes");
  const Tensor send = h.send.narrow0(0, n * B * Tl * w), recv = h.recv.narrow0(0, n * B * Tl * w);
  char *out = static_cast<char*>(send.raw()), *in = static_cast<char*>(src.raw());
  for (int64_t j = 0; j < n; ++j)
    for (int64_t r = 0; r < B * Tl; ++r) {
      char* to = out + ((j * B * Tl) + r) * w * e;
      const char* row = in + r * W * e;
      for (int64_t col0 = 0; int64_t sw : seg) {  // each segment's share j
        std::memcpy(to, row + (col0 + j * (sw / n)) * e, size_t((sw / n) * e));
        to += (sw / n) * e;
        col0 += sw;
      }
    }
  group.all_to_all(send, recv);
  const char* got = static_cast<const char*>(recv.raw());
  char* whole = static_cast<char*>(dst.raw());
  for (int64_t s = 0; s < n; ++s)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < Tl; ++t)
        std::memcpy(whole + (b * T + h.slot[size_t(s * Tl + t)]) * w * e,
                    got + ((s * B + b) * Tl + t) * w * e, size_t(w * e));
}

void ContextParallel::to_chunks(const Tensor& dst, const Tensor& src,
                                std::initializer_list<int64_t> seg) const {
  HeadScratch& h = *heads;
  dist::Communicator& group = head_group();
  const int64_t n = group.size(), B = dst.dim(0), Tl = dst.dim(1), W = dst.dim(2), w = W / n;
  const int64_t T = Tl * n, e = int64_t(dtype_size(dst.dtype()));
  NK_CHECK(src.dim(0) == B && src.dim(1) == T && src.dim(2) == w && dst.dtype() == src.dtype(),
           "context parallel a2a: to_chunks shapes");
  const Tensor send = h.send.narrow0(0, n * B * Tl * w), recv = h.recv.narrow0(0, n * B * Tl * w);
  char* out = static_cast<char*>(send.raw());
  const char* whole = static_cast<const char*>(src.raw());
  for (int64_t j = 0; j < n; ++j)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < Tl; ++t)
        std::memcpy(out + ((j * B + b) * Tl + t) * w * e,
                    whole + (b * T + h.slot[size_t(j * Tl + t)]) * w * e, size_t(w * e));
  group.all_to_all(send, recv);
  const char* got = static_cast<const char*>(recv.raw());
  char* local = static_cast<char*>(dst.raw());
  for (int64_t s = 0; s < n; ++s)
    for (int64_t r = 0; r < B * Tl; ++r) {
      const char* from = got + ((s * B * Tl) + r) * w * e;
      char* row = local + r * W * e;
      for (int64_t col0 = 0; int64_t sw : seg) {  // rank s's share of each segment
        std::memcpy(row + (col0 + s * (sw / n)) * e, from, size_t((sw / n) * e));
        from += (sw / n) * e;
        col0 += sw;
      }
    }
}

// a2a: the one-process kernel on this rank's heads over the whole row;
// a2a+p2p: ring attention over the outer ring on them.
void ContextParallel::a2a_forward(Tensor out, Tensor lse, const Tensor& qkv, int64_t n_head,
                                  int64_t n_kv_head, const Tensor& cu_seqlens, int64_t window,
                                  float scale, float softcap) const {
  prepare_heads(qkv, n_head, n_kv_head);
  HeadScratch& h = *heads;
  const int64_t n = head_group().size(), D = h.out_width / n_head, B = qkv.dim(0),
                T = qkv.dim(1) * n;
  to_heads(h.qkv, qkv, {n_head * D, n_kv_head * D, n_kv_head * D});
  // lse [B, Hq, T/n] holds this rank's heads' [B, Hq/n, T].
  const Tensor heads_lse = lse.view({B, n_head / n, T});
  if (comm_type == CpComm::A2AP2P)
    ring_forward(*p2p_comm, h.out, heads_lse, h.qkv, n_head / n, n_kv_head / n, cu_seqlens, window,
                 scale, softcap);
  else
    ops::attention_forward(h.out, heads_lse, h.qkv, n_head / n, n_kv_head / n, cu_seqlens, window,
                           scale, softcap);
  to_chunks(out, h.out, {n_head * D});
}

void ContextParallel::a2a_backward(Tensor dqkv, const Tensor& dout, const Tensor& qkv,
                                   const Tensor& out, const Tensor& lse, int64_t n_head,
                                   int64_t n_kv_head, const Tensor& cu_seqlens, int64_t window,
                                   float scale, float softcap) const {
  prepare_heads(qkv, n_head, n_kv_head);
  HeadScratch& h = *heads;
  const int64_t n = head_group().size(), D = h.out_width / n_head, B = qkv.dim(0),
                T = qkv.dim(1) * n;
  const std::initializer_list<int64_t> qkv_seg = {n_head * D, n_kv_head * D, n_kv_head * D};
  to_heads(h.qkv, qkv, qkv_seg);
  to_heads(h.out, out, {n_head * D});
  to_heads(h.dout, dout, {n_head * D});
  const Tensor heads_lse = lse.view({B, n_head / n, T});
  if (comm_type == CpComm::A2AP2P)
    ring_backward(*p2p_comm, h.dqkv, h.dout, h.qkv, h.out, heads_lse, n_head / n, n_kv_head / n,
                  cu_seqlens, window, scale, softcap);
  else
    ops::attention_backward(h.dqkv, h.dout, h.qkv, h.out, heads_lse, n_head / n, n_kv_head / n,
                            cu_seqlens, window, scale, softcap);
  to_chunks(dqkv, h.dqkv, qkv_seg);
}

}  // namespace nk::nn
