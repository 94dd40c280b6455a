// What context parallelism's attention holds and sends per layer
// (nn/context_parallel.h), for the step log and `nekton estimate`.
#include <fmt/format.h>

#include "nn/context_parallel.h"

namespace nk::nn {
namespace {

// Ring attention over n ranks on blocks of kv bytes (f32 gradient blocks of
// kv4 bytes): n − 1 blocks on in the forward; the blocks again and their
// gradients round the whole ring (back to the owner) in the backward.
CpExchangeBytes cp_ring_bytes(int64_t n, int64_t kv, int64_t kv4) {
  if (n <= 1) return {};
  return {(n - 1) * kv, (n - 1) * kv + n * kv4};
}

// The all-to-all of the heads over n ranks of local bytes w (qkv) and q (out):
// (n − 1) / n of each leaves; qkv and out forward, qkv, out, dout and dqkv backward.
CpExchangeBytes cp_head_bytes(int64_t n, int64_t w, int64_t q) {
  if (n <= 1) return {};
  return {(n - 1) * (w + q) / n, (n - 1) * (2 * w + 2 * q) / n};
}

}  // namespace

int64_t cp_buffer_bytes(CpComm c, int64_t cp, int64_t a2a, int64_t B, int64_t T, int64_t n_head,
                        int64_t n_kv_head, int64_t D, DType dt) {
  switch (c) {
    case CpComm::P2P:
      return RingScratch::bytes_for(B, T, n_head, n_kv_head, D, dt);
    case CpComm::A2A:
      return HeadScratch::bytes_for(B, T, n_head, n_kv_head, D, dt);
    case CpComm::AllGather:
      return GatherScratch::bytes_for(B, T, n_head, n_kv_head, D, dt, cp);
    case CpComm::A2AP2P:
      return HeadScratch::bytes_for(B, T, n_head, n_kv_head, D, dt) +
             RingScratch::bytes_for(B, a2a * T, n_head / a2a, n_kv_head / a2a, D, dt);
  }
  return 0;
}

CpExchangeBytes cp_exchange_bytes(CpComm c, int64_t cp, int64_t a2a, int64_t B, int64_t T,
                                  int64_t n_head, int64_t n_kv_head, int64_t D, DType dt) {
  if (cp <= 1) return {};
  const int64_t e = int64_t(dtype_size(dt)), kv = B * T * 2 * n_kv_head * D;
  const int64_t q = B * T * n_head * D, w = q + kv;
  switch (c) {
    case CpComm::P2P:
      return cp_ring_bytes(cp, kv * e, kv * 4);
    case CpComm::AllGather:  // the ring's, less the gradients' last hop (reduce-scatter)
      return {(cp - 1) * kv * e, (cp - 1) * kv * e + (cp - 1) * kv * 4};
    case CpComm::A2A:
      return cp_head_bytes(cp, w * e, q * e);
    case CpComm::A2AP2P: {
      // The ring's blocks: a2a times the tokens, 1/a2a of the heads.
      const CpExchangeBytes h = cp_head_bytes(a2a, w * e, q * e),
                            r = cp_ring_bytes(cp / a2a, kv * e, kv * 4);
      return {h.forward + r.forward, h.backward + r.backward};
    }
  }
  return {};
}

std::string cp_comm_summary(CpComm c, int64_t cp, int64_t a2a, int64_t n_head, int64_t T,
                            int64_t buffer_bytes) {
  std::string how;
  const char* kind = "";
  switch (c) {
    case CpComm::P2P:
      how = "ring attention", kind = "ring";
      break;
    case CpComm::A2A:
      how = fmt::format(
          "all-to-all attention (parallel.cp_comm_type=a2a: {} of the {} query heads on the "
          "whole row per rank)",
          n_head / cp, n_head);
      kind = "all-to-all";
      break;
    case CpComm::AllGather:
      how = fmt::format(
          "all-gather attention (parallel.cp_comm_type=all_gather: the whole row's {} keys and "
          "values on every rank)",
          T);
      kind = "all-gather";
      break;
    case CpComm::A2AP2P:
      how = fmt::format(
          "hierarchical attention (parallel.cp_comm_type=a2a+p2p: all-to-all within groups of "
          "{} ranks, {} of the {} query heads per rank, ring attention across {} groups)",
          a2a, n_head / a2a, n_head, cp / a2a);
      kind = "all-to-all and ring";
      break;
  }
  return fmt::format("{} over the cp group ({:.1f} MiB of {} buffers shared by the layers)", how,
                     double(buffer_bytes) / 1048576.0, kind);
}

}  // namespace nk::nn
