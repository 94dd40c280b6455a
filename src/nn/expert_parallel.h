// Expert parallelism as the MoE block sees it (Megatron-Core's all-to-all
// token dispatcher). The E experts of a layer are split in equal counts over
// the mesh's "ep" group: rank r computes experts [r E/ep, (r+1) E/ep). After
// routing, each rank's kept (token, expert) pairs are already grouped by
// expert (nn/moe.h's counting sort), hence by destination rank; then
//
//   plan      the per-expert row counts exchanged (all_to_all on i64): each
//             rank learns how many rows every source sends each of its experts
//   dispatch  the rows exchanged (all_to_allv) and regrouped by local expert,
//             each expert's rows in source-rank order, each source's in its
//             token order (deterministic, dropless: nothing is cut)
//   combine   the experts' outputs regrouped by source and sent back
//             (all_to_allv), arriving in the order they were sent
//
// dispatch and combine are each other's backward (the gradient of the
// outputs goes out as the inputs did; the inputs' gradients come back as
// the outputs did), so the backward reuses the forward's plan.
//
// Every exchange waits at most the communicator's timeout: a dead peer is a
// TimeoutError naming it, never a hang. The wall time spent in the exchanges
// is added to *seconds (the step log's a2a_ms). Without a communicator (or a
// group of one) the block is its plain self.
#pragma once
#include <chrono>
#include <memory>
#include <span>
#include <vector>

#include "core/error.h"
#include "dist/communicator.h"
#include "ops/moe.h"
#include "ops/ops.h"

namespace nk::nn {

// One forward's exchange: its plan (host) and index buffers (device), kept
// for the backward. R: the rows this rank's experts received, at most
// capacity() = ep N k.
struct ExpertExchange {
  Tensor counts_send, counts_recv;  // i64 [E]: the all_to_all of the per-expert counts
  Tensor to_expert;                 // i32 [capacity]: expert-grouped row i <- received row
  Tensor to_source;                 // i32 [capacity]: received row j <- expert-grouped row
  std::vector<int64_t> send_rows, recv_rows;  // [ep] rows to / from each rank
  std::vector<int64_t> local_rows;            // [E/ep] rows of each local expert
  std::vector<int64_t> recv_counts;           // [ep E/ep] rows from rank s for local expert j
  std::vector<int32_t> host_to_expert, host_to_source;
  int64_t rows = 0;  // R of the last plan
  int64_t capacity() const { return to_expert.defined() ? to_expert.dim(0) : 0; }

  template <typename Alloc>
  static std::shared_ptr<ExpertExchange> make(int64_t capacity, int64_t E, Alloc&& alloc) {
    auto x = std::make_shared<ExpertExchange>();
    x->counts_send = alloc(Shape{E}, DType::I64);
    x->counts_recv = alloc(Shape{E}, DType::I64);
    x->to_expert = alloc(Shape{capacity}, DType::I32);
    x->to_source = alloc(Shape{capacity}, DType::I32);
    x->host_to_expert.resize(size_t(capacity));
    x->host_to_source.resize(size_t(capacity));
    return x;
  }
};

struct ExpertParallel {
  dist::Communicator* comm = nullptr;  // the mesh's "ep" group; null: size 1
  std::shared_ptr<double> seconds;     // time in the exchanges, accumulated (may be null)

  int64_t size() const { return comm ? comm->size() : 1; }
  int64_t rank() const { return comm ? comm->rank() : 0; }
  bool active() const { return size() > 1; }
  int64_t local_experts(int64_t E) const { return E / size(); }
  int64_t first_expert(int64_t E) const { return rank() * local_experts(E); }

  // kept [E]: the rows this rank sends to each expert, grouped by expert in
  // that order. Exchanges the counts and fills x's plan. Collective.
  void plan(ExpertExchange& x, std::span<const int64_t> kept) const {
    const int64_t E = int64_t(kept.size()), P = size(), El = local_experts(E);
    NK_CHECK(El * P == E, "expert parallel: {} experts over {} ranks", E, P);
    ops::copy_bytes_from_host(x.counts_send, kept.data());
    timed([&] { comm->all_to_all(x.counts_send, x.counts_recv); });
    x.recv_counts.resize(size_t(E));
    ops::copy_bytes_to_host(x.counts_recv, x.recv_counts.data());
    x.send_rows.assign(size_t(P), 0);
    x.recv_rows.assign(size_t(P), 0);
    x.local_rows.assign(size_t(El), 0);
    for (int64_t e = 0; e < E; ++e) x.send_rows[size_t(e / El)] += kept[size_t(e)];
    for (int64_t s = 0; s < P; ++s)
      for (int64_t j = 0; j < El; ++j) {
        const int64_t n = x.recv_counts[size_t(s * El + j)];
        if (n < 0) fail("expert parallel: rank {} of group '{}' sent {} rows", s, comm->name(), n);
        x.recv_rows[size_t(s)] += n;
        x.local_rows[size_t(j)] += n;
      }
    int64_t R = 0;
    for (int64_t n : x.recv_rows) R += n;
    NK_CHECK(R <= x.capacity(), "expert parallel: {} rows received, room for {}", R, x.capacity());
    // Received rows come source-major (source s, then its local experts in
    // order); the experts' products want them expert-major.
    std::vector<int64_t> at(size_t(P * El));  // first received row of (s, j)
    for (int64_t i = 0, acc = 0; i < P * El; ++i) {
      at[size_t(i)] = acc;
      acc += x.recv_counts[size_t(i)];
    }
    int64_t row = 0;
    for (int64_t j = 0; j < El; ++j)
      for (int64_t s = 0; s < P; ++s)
        for (int64_t n = 0; n < x.recv_counts[size_t(s * El + j)]; ++n, ++row) {
          const int32_t from = int32_t(at[size_t(s * El + j)] + n);
          x.host_to_expert[size_t(row)] = from;
          x.host_to_source[size_t(from)] = int32_t(row);
        }
    x.rows = R;
    if (R > 0) {
      ops::copy_bytes_from_host(x.to_expert.narrow0(0, R), x.host_to_expert.data());
      ops::copy_bytes_from_host(x.to_source.narrow0(0, R), x.host_to_source.data());
    }
  }
  // rows [M, C] (M = sum of kept, grouped by expert) -> xe [R, C]: the rows
  // of this rank's experts, grouped by local expert. stage: [capacity, C]
  // scratch. Collective.
  void dispatch(const ExpertExchange& x, const Tensor& rows, const Tensor& xe,
                const Tensor& stage) const {
    const Tensor got = stage.narrow0(0, x.rows);
    timed([&] { comm->all_to_allv(rows, x.send_rows, got, x.recv_rows); });
    if (x.rows > 0) ops::moe_gather(xe.narrow0(0, x.rows), got, x.to_expert.narrow0(0, x.rows));
  }
  // ye [R, C] grouped by local expert -> rows [M, C] back on the ranks that
  // sent them, in the order they were sent. stage: [capacity, C]. Collective.
  void combine(const ExpertExchange& x, const Tensor& ye, const Tensor& rows,
               const Tensor& stage) const {
    const Tensor back = stage.narrow0(0, x.rows);
    if (x.rows > 0) ops::moe_gather(back, ye.narrow0(0, x.rows), x.to_source.narrow0(0, x.rows));
    timed([&] { comm->all_to_allv(back, x.recv_rows, rows, x.send_rows); });
  }

 private:
  template <typename Fn>
  void timed(Fn&& fn) const {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    if (seconds)
      *seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

}  // namespace nk::nn
