// Context parallelism (Megatron-Core's cp): every activation of a sequence
// split over the ranks of the mesh's "cp" group, attention done as ring
// attention. Each row of T tokens is cut into 2·cp chunks of c = T / (2·cp)
// tokens; rank r holds chunk r and chunk 2·cp−1−r, in that order, as its
// T / cp local tokens (causal load balance: every rank gets one early and one
// late chunk, so the same share of the attention's work). Embeddings, norms,
// MLP and the loss run on the local tokens only; rotary and learned
// positions use the tokens' global positions (cp_positions).
//
// Ring attention: the ranks' key/value blocks [B, T/cp, 2 Hkv D] travel
// around the ring (send to rank r+1, receive from r−1, point to point,
// posted before the block's computation so they move while it runs). At
// step s rank r attends with its queries to rank (r−s)'s keys, each block's
// softmax merged into the running output through the log-sum-exp
// (ops::attention_block_forward). Which query/key pairs meet is decided by
// the global positions, so per chunk pair the block is full (an earlier
// chunk), causal (the same chunk) or empty (a later chunk). The backward
// sends the blocks around again with their gradients dK/dV, which each rank
// adds its share to and passes on; after cp steps every block's gradient is
// back at its owner. The log-sum-exp and output saved are the final ones,
// exactly as one process's attention_forward gives them.
//
// Without a communicator (or with a group of one) every call is the plain
// op and the block is its plain self, bit for bit.
#pragma once
#include <memory>
#include <vector>

#include "dist/communicator.h"
#include "ops/ops.h"

namespace nk::nn {

// Global position of local token t (0 <= t < 2c) of cp rank r of cp ranks,
// with chunks of c tokens.
inline int64_t cp_global_position(int64_t t, int64_t r, int64_t cp, int64_t c) {
  return t < c ? r * c + t : (2 * cp - 1 - r) * c + (t - c);
}

// The ring's buffers, shared by every layer (one layer's attention runs at a
// time): allocated at the first call of a shape, reused after.
struct RingScratch {
  int64_t B = 0, T = 0, kv_width = 0, out_width = 0;
  DType dtype = DType::F32;
  std::vector<Tensor> positions;  // i32 [T] per cp rank: its tokens' global positions
  Tensor kv[2];                   // [B, T, 2 Hkv D]: the block held and the one arriving
  Tensor dkv[2];                  // f32, the same: its gradient so far, held and arriving
  Tensor out;                     // f32 [B, T, Hq D] running output; dq in the backward
  Tensor cast_q, cast_kv;         // compute-dtype copies of dq, dkv when it is not f32
  Tensor qstart;                  // i32 [B, T], packed rows: each local token's document start

  // What these buffers take for B rows of T local tokens with n_head query
  // and n_kv_head key/value heads of D values in dtype dt.
  static int64_t bytes_for(int64_t B, int64_t T, int64_t n_head, int64_t n_kv_head, int64_t D,
                           DType dt) {
    const int64_t kvw = 2 * n_kv_head * D, ow = n_head * D, e = int64_t(dtype_size(dt));
    return B * T * (2 * kvw * e + 2 * kvw * 4 + ow * 4 + (dt != DType::F32 ? (ow + kvw) * e : 0));
  }
};

struct ContextParallel {
  dist::Communicator* comm = nullptr;  // the mesh's "cp" group; null: size 1
  std::shared_ptr<RingScratch> ring = std::make_shared<RingScratch>();

  int64_t size() const { return comm ? comm->size() : 1; }
  int64_t rank() const { return comm ? comm->rank() : 0; }
  bool active() const { return size() > 1; }

  // ops::attention_forward over the whole sequence, for this rank's queries:
  // out [B, T/cp, Hq D], lse f32 [B, Hq, T/cp] of the local tokens of qkv
  // [B, T/cp, (Hq + 2 Hkv) D]. Packed rows: cu_seqlens i32 [B, S+1] of the
  // whole rows (global positions), each query seeing its own document only.
  // scale and softcap (Gemma's) as ops::attention_forward's.
  void attention_forward(Tensor out, Tensor lse, const Tensor& qkv, int64_t n_head,
                         int64_t n_kv_head, const Tensor& cu_seqlens, int64_t window,
                         float scale = 0.f, float softcap = 0.f) const;
  // ops::attention_backward: dqkv of the local tokens, the keys' and values'
  // gradients summed over every rank's queries.
  void attention_backward(Tensor dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          const Tensor& lse, int64_t n_head, int64_t n_kv_head,
                          const Tensor& cu_seqlens, int64_t window, float scale = 0.f,
                          float softcap = 0.f) const;
  // n summed over the group (the loss's count of target tokens): n itself at size 1.
  int64_t total(int64_t n) const;

 private:
  void prepare(const Tensor& qkv, int64_t n_head, int64_t n_kv_head) const;
};

}  // namespace nk::nn
