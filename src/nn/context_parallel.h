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
// All-to-all (DeepSpeed-Ulysses; parallel.cp_comm_type=a2a, CpComm::A2A):
// instead of the ring, an all-to-all over the cp group trades each rank's
// Q/K/V columns of its two chunks for every rank's tokens of 1/cp of the
// heads: rank j receives query heads [j Hq/cp, (j+1) Hq/cp) and key/value
// heads [j Hkv/cp, (j+1) Hkv/cp) (the query heads' own groups under GQA) for
// the whole row, put back in true token order. It runs the one-process
// attention kernel on them (windows, soft-caps and packed documents as one
// process has them), and a second all-to-all returns each rank's output
// heads for every rank's chunks. Its log-sum-exp stays with the heads,
// f32 [B, Hq/cp, T] in the [B, Hq, T/cp] buffer (the same size; only the
// backward reads it). The backward trades qkv, out and dout the same way,
// runs the one-process backward and sends dQ/dK/dV back to the chunks.
// Needs Hq and Hkv to be multiples of cp (check_context_parallel).
//
// All-gather (parallel.cp_comm_type=all_gather, CpComm::AllGather): every
// rank's key/value block [B, T/cp, 2 Hkv D] gathered over the cp group and
// laid out as the whole row [B, T, 2 Hkv D] in token order; each rank's
// queries attend to it in one call of the block kernel at their global
// positions (causal, windows, packed documents, GQA as the ring's; the
// kernel skips the tiles of later keys). The backward gathers again, sums
// the whole row's dK/dV of this rank's queries and reduce-scatters them
// back to their owners. Memory O(T) for K/V per rank (GatherScratch), no
// overlap; the same bytes on the wire as the ring, in two collectives.
//
// Hierarchical (parallel.cp_comm_type=a2a+p2p, CpComm::A2AP2P, Megatron's
// parallel.hierarchical_context_parallel_sizes = a,p with a × p = cp): the
// cp group cut into a2a groups of a consecutive cp ranks (inner) and rings
// of the p ranks with the same place in them (outer). The all-to-all above
// runs over the a2a group: a2a group j (cp ranks j a .. j a + a − 1) holds
// chunks j a .. j a + a − 1 and their mirrors, which are the two chunks
// j and 2p−1−j of a row cut in 2p chunks of a·c tokens; so after it each
// rank holds 1/a of the heads for the 2·a·c tokens of ring rank j laid out
// as cp_global_position(t, j, p, a c), and runs ring attention over its
// ring; a second all-to-all returns the output. Needs Hq and Hkv to be
// multiples of a (check_context_parallel).
//
// Without a communicator (or with a group of one) every call is the plain
// op and the block is its plain self, bit for bit.
#pragma once
#include <initializer_list>
#include <memory>
#include <string>
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

// The all-to-all variant's buffers (shared by every layer as the ring's).
// n: the all-to-all's group (cp under a2a, the a2a size under a2a+p2p).
struct HeadScratch {
  int64_t B = 0, T = 0, qkv_width = 0, out_width = 0;
  DType dtype = DType::F32;
  Tensor send, recv;          // [n, B, T, (Hq + 2 Hkv) D / n]: the all-to-all's blocks
  Tensor qkv, dqkv;           // [B, n T, (Hq + 2 Hkv) D / n]: the group's tokens, this rank's heads
  Tensor out, dout;           // [B, n T, Hq D / n]
  std::vector<int64_t> slot;  // [n T]: where token t of group rank s goes (at s T + t), in
                              // token order: its global position under a2a

  // What these buffers take for B rows of T local tokens (T · cp in all)
  // with n_head query and n_kv_head key/value heads of D values in dtype dt.
  static int64_t bytes_for(int64_t B, int64_t T, int64_t n_head, int64_t n_kv_head, int64_t D,
                           DType dt) {
    const int64_t w = (n_head + 2 * n_kv_head) * D, ow = n_head * D;
    return B * T * (4 * w + 2 * ow) * int64_t(dtype_size(dt));
  }
};

// The all-gather variant's buffers (shared by every layer as the ring's):
// T local tokens, T cp in the row.
struct GatherScratch {
  int64_t B = 0, T = 0, kv_width = 0, out_width = 0;
  DType dtype = DType::F32;
  Tensor positions;        // i32 [T]: this rank's tokens' global positions
  Tensor keys;             // i32 [T cp]: 0, 1, ..., T cp − 1, the gathered row's positions
  Tensor mine;             // [B, T, 2 Hkv D]: this rank's keys and values, sent
  Tensor blocks;           // [cp, B, T, 2 Hkv D]: every rank's, as gathered
  Tensor kv;               // [B, T cp, 2 Hkv D]: the whole row in token order
  Tensor dkv;              // f32 [B, T cp, 2 Hkv D]: its gradient from this rank's queries
  Tensor dblocks;          // f32 [cp, B, T, 2 Hkv D]: the same per owner, reduce-scattered
  Tensor dmine;            // f32 [B, T, 2 Hkv D]: the gradient of this rank's keys and values
  Tensor out;              // f32 [B, T, Hq D] running output; dq in the backward
  Tensor cast_q, cast_kv;  // compute-dtype copies of dq, dmine when it is not f32
  Tensor qstart;           // i32 [B, T], packed rows: each local token's document start

  // What these buffers take for B rows of T local tokens over cp ranks
  // (as RingScratch::bytes_for; the positions aside).
  static int64_t bytes_for(int64_t B, int64_t T, int64_t n_head, int64_t n_kv_head, int64_t D,
                           DType dt, int64_t cp) {
    const int64_t kvw = 2 * n_kv_head * D, ow = n_head * D, e = int64_t(dtype_size(dt));
    return B * T *
           ((1 + 2 * cp) * kvw * e + (2 * cp + 1) * kvw * 4 + ow * 4 +
            (dt != DType::F32 ? (ow + kvw) * e : 0));
  }
};

// parallel.cp_comm_type: Megatron-Core's names.
enum class CpComm { P2P, A2A, AllGather, A2AP2P };
// "p2p" / "a2a" / "all_gather" / "a2a+p2p"; nk::Error naming
// parallel.cp_comm_type for anything else.
CpComm parse_cp_comm(const std::string& s);
const char* cp_comm_name(CpComm c);

// Bytes one rank sends in the attention's exchanges of one layer for B rows
// of T local tokens over cp ranks (a2a: the a2a group's size under a2a+p2p),
// n_head / n_kv_head of D values in dtype dt: forward, and backward (its
// recompute-free share: the forward's exchanges again where it needs the
// keys, and the gradients). Collectives as a ring algorithm sends them
// ((n − 1) / n of the whole).
struct CpExchangeBytes {
  int64_t forward = 0, backward = 0;
};
CpExchangeBytes cp_exchange_bytes(CpComm c, int64_t cp, int64_t a2a, int64_t B, int64_t T,
                                  int64_t n_head, int64_t n_kv_head, int64_t D, DType dt);

// What the attention's buffers of variant c take (RingScratch,
// HeadScratch, GatherScratch; a2a+p2p: the all-to-all's over groups of a2a
// ranks and the ring's over a2a × T tokens of 1/a2a of the heads) for B
// rows of T local tokens over cp ranks.
int64_t cp_buffer_bytes(CpComm c, int64_t cp, int64_t a2a, int64_t B, int64_t T, int64_t n_head,
                        int64_t n_kv_head, int64_t D, DType dt);

// The step log's account of variant c over cp ranks (a2a: the a2a group's
// size under a2a+p2p) for the n_head query heads of a tp rank, rows of T
// tokens and its buffers' bytes (cp_buffer_bytes), e.g. "all-to-all
// attention (parallel.cp_comm_type=a2a: 2 of the 4 query heads on the whole
// row per rank) over the cp group (0.1 MiB of all-to-all buffers shared by
// the layers)".
std::string cp_comm_summary(CpComm c, int64_t cp, int64_t a2a, int64_t n_head, int64_t T,
                            int64_t buffer_bytes);

// Packed rows: qstart i32 [B, T] <- the document start (a global position)
// of each of the tokens at `positions` i32 [T], from the whole rows'
// cu_seqlens i32 [B, S+1] (ops::attention_forward's convention); left
// undefined without.
void cp_document_starts(Tensor& qstart, const Tensor& cu_seqlens, const Tensor& positions);

struct ContextParallel {
  dist::Communicator* comm = nullptr;  // the mesh's "cp" group; null: size 1
  CpComm comm_type = CpComm::P2P;
  // a2a+p2p: the mesh's "hierarchical-cp-a2a" (inner) and
  // "hierarchical-cp-p2p" (outer ring) groups within comm.
  dist::Communicator* a2a_comm = nullptr;
  dist::Communicator* p2p_comm = nullptr;
  std::shared_ptr<RingScratch> ring = std::make_shared<RingScratch>();
  std::shared_ptr<HeadScratch> heads = std::make_shared<HeadScratch>();
  std::shared_ptr<GatherScratch> gather = std::make_shared<GatherScratch>();

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
  // Ring attention over ring_comm (the cp group, or a2a+p2p's outer ring) for
  // the tokens qkv [B, T, (Hq + 2 Hkv) D] of this ring rank, laid out as
  // cp_global_position(t, ring rank, ring size, T / 2).
  void prepare_ring(const Tensor& qkv, int64_t n_head, int64_t n_kv_head, int64_t n) const;
  void ring_forward(dist::Communicator& ring_comm, Tensor out, Tensor lse, const Tensor& qkv,
                    int64_t n_head, int64_t n_kv_head, const Tensor& cu_seqlens, int64_t window,
                    float scale, float softcap) const;
  void ring_backward(dist::Communicator& ring_comm, Tensor dqkv, const Tensor& dout,
                     const Tensor& qkv, const Tensor& out, const Tensor& lse, int64_t n_head,
                     int64_t n_kv_head, const Tensor& cu_seqlens, int64_t window, float scale,
                     float softcap) const;
  // The all-to-all variant and a2a+p2p (nn/context_parallel_a2a.cc).
  // The group the heads' all-to-all runs over: cp, or a2a+p2p's inner one.
  dist::Communicator& head_group() const;
  void prepare_heads(const Tensor& qkv, int64_t n_head, int64_t n_kv_head) const;
  void a2a_forward(Tensor out, Tensor lse, const Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                   const Tensor& cu_seqlens, int64_t window, float scale, float softcap) const;
  void a2a_backward(Tensor dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                    const Tensor& lse, int64_t n_head, int64_t n_kv_head, const Tensor& cu_seqlens,
                    int64_t window, float scale, float softcap) const;
  // src [B, T, W] (columns: segments of `seg` widths, each split into n
  // equal shares) -> dst [B, n T, W/n]: the head group's tokens of this
  // rank's shares, in token order (HeadScratch::slot).
  void to_heads(const Tensor& dst, const Tensor& src, std::initializer_list<int64_t> seg) const;
  // The inverse: src [B, n T, W/n] -> dst [B, T, W].
  void to_chunks(const Tensor& dst, const Tensor& src, std::initializer_list<int64_t> seg) const;
  // The all-gather variant (nn/context_parallel_gather.cc).
  void prepare_gather(const Tensor& qkv, int64_t n_head, int64_t n_kv_head) const;
  // GatherScratch::kv <- every rank's key/value columns of qkv, in token order.
  void gather_kv(const Tensor& qkv) const;
  void ag_forward(Tensor out, Tensor lse, const Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                  const Tensor& cu_seqlens, int64_t window, float scale, float softcap) const;
  void ag_backward(Tensor dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                   const Tensor& lse, int64_t n_head, int64_t n_kv_head, const Tensor& cu_seqlens,
                   int64_t window, float scale, float softcap) const;
};

}  // namespace nk::nn
