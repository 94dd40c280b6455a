// Communicator: collectives and point-to-point messages within one process
// group of the Mesh (one Communicator per group; backends: dist/mpi, later
// dist/nccl). Every operation exists non-blocking (`*_async`, returning a Work
// to wait on) and blocking (the same, waited at once).
//
// Buffers are contiguous Tensors (a flat gradient-arena region is a 1-D view of
// the arena) on the backend's device; a pending Work keeps them alive. The
// caller must not touch them until the Work is done. All ranks of the group
// must issue the same operations in the same order (as in MPI and NCCL); each
// operation gets the next sequence number of this communicator (`#N` in errors).
//
// Dtypes: data movement (all_gather, all_to_all(v), broadcast, send/recv)
// takes any dtype. Reductions take f32, f64, i32, i64, and bf16/f16, which are
// widened to f32, reduced in f32 (sums accumulate in f32, in the backend's
// order) and rounded once to the 16-bit type at the end; integer Avg is refused.
//
// Timeouts: every wait gives up `timeout()` seconds after it began and throws
// TimeoutError naming this rank, the group, the operation and its number, and
// the missing ranks (see the backend for how they are found). After that the
// process must not try to finish MPI normally: the backend's runtime aborts the
// job when it is torn down.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace nk::dist {

enum class ReduceOp { Sum, Avg, Max };
const char* reduce_op_name(ReduceOp op);

// A peer did not join an operation in time. Its message names rank, group, op, missing ranks.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// One pending operation.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation is complete (idempotent). Throws TimeoutError,
  // or nk::Error for a transport failure.
  virtual void wait() = 0;
  // Advances the operation without blocking; true once it is complete (wait()
  // then returns at once).
  virtual bool test() = 0;
};
using WorkPtr = std::unique_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  const std::string& name() const { return name_; }  // the mesh group's name, "dp-cp"
  int rank() const { return rank_; }                 // this process's rank in the group
  int size() const { return int(world_ranks_.size()); }
  const std::vector<int>& world_ranks() const { return world_ranks_; }  // group rank -> world
  double timeout() const { return timeout_s_; }                         // seconds
  void set_timeout(double seconds);

  // x on every rank becomes op(x of all ranks).
  WorkPtr all_reduce_async(const Tensor& x, ReduceOp op = ReduceOp::Sum);
  // in: size()·n elements, out: n. Rank r's out = op over ranks of in[r·n, (r+1)·n).
  WorkPtr reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::Sum);
  // in: n elements, out: size()·n; out[r·n, (r+1)·n) = rank r's in.
  WorkPtr all_gather_async(const Tensor& in, const Tensor& out);
  // in, out: size()·n elements; block j of in goes to rank j, arriving as block `rank()` there.
  WorkPtr all_to_all_async(const Tensor& in, const Tensor& out);
  // Uneven all-to-all in rows (dim 0; other dims equal): in = [sum(send_rows), ...],
  // the first send_rows[0] rows to rank 0, the next send_rows[1] to rank 1, ...;
  // out = [sum(recv_rows), ...] in order of source rank. recv_rows[j] must equal
  // rank j's send_rows[rank()] (exchange the counts first, e.g. with all_to_all on i64).
  WorkPtr all_to_allv_async(const Tensor& in, std::span<const int64_t> send_rows, const Tensor& out,
                            std::span<const int64_t> recv_rows);
  // Uneven blocks of one flat buffer, in place (Megatron's distributed
  // optimizer: a gradient bucket reduce-scattered, the updated parameter
  // shards gathered back). Rank j's block of x is [sum(counts[0, j)),
  // + counts[j]); the counts (one per rank, >= 0) add up to x.numel().
  // reduce_scatter_v: this rank's block becomes op over every rank's copy of
  // it; the other blocks are left undefined (the backend may use them as
  // scratch). all_gather_v: every block becomes its owner's block.
  WorkPtr reduce_scatter_v_async(const Tensor& x, std::span<const int64_t> counts,
                                 ReduceOp op = ReduceOp::Sum);
  WorkPtr all_gather_v_async(const Tensor& x, std::span<const int64_t> counts);
  // x on every rank becomes root's x.
  WorkPtr broadcast_async(const Tensor& x, int root);
  // Point to point with group ranks; a recv buffer must have the size sent.
  WorkPtr send_async(const Tensor& x, int dst, int tag = 0);
  WorkPtr recv_async(const Tensor& x, int src, int tag = 0);
  WorkPtr barrier_async();

  void all_reduce(const Tensor& x, ReduceOp op = ReduceOp::Sum) { all_reduce_async(x, op)->wait(); }
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::Sum) {
    reduce_scatter_async(in, out, op)->wait();
  }
  void all_gather(const Tensor& in, const Tensor& out) { all_gather_async(in, out)->wait(); }
  void all_to_all(const Tensor& in, const Tensor& out) { all_to_all_async(in, out)->wait(); }
  void all_to_allv(const Tensor& in, std::span<const int64_t> send_rows, const Tensor& out,
                   std::span<const int64_t> recv_rows) {
    all_to_allv_async(in, send_rows, out, recv_rows)->wait();
  }
  void reduce_scatter_v(const Tensor& x, std::span<const int64_t> counts,
                        ReduceOp op = ReduceOp::Sum) {
    reduce_scatter_v_async(x, counts, op)->wait();
  }
  void all_gather_v(const Tensor& x, std::span<const int64_t> counts) {
    all_gather_v_async(x, counts)->wait();
  }
  void broadcast(const Tensor& x, int root) { broadcast_async(x, root)->wait(); }
  void send(const Tensor& x, int dst, int tag = 0) { send_async(x, dst, tag)->wait(); }
  void recv(const Tensor& x, int src, int tag = 0) { recv_async(x, src, tag)->wait(); }
  void barrier() { barrier_async()->wait(); }

  // "rank 3 (world 7), group 'dp-cp' all_reduce #12" (seq 0: no number): the
  // prefix of every error about an operation.
  std::string where(const char* op, uint64_t seq) const;

 protected:
  Communicator(std::string name, std::vector<int> world_ranks, int rank, double timeout_s);

  // Backend hooks, called after the argument checks above (contiguous buffers,
  // dtypes, sizes, ranks in range). Counts are in elements unless named rows.
  virtual WorkPtr do_all_reduce(const Tensor& x, ReduceOp op) = 0;
  virtual WorkPtr do_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) = 0;
  virtual WorkPtr do_all_gather(const Tensor& in, const Tensor& out) = 0;
  virtual WorkPtr do_all_to_all(const Tensor& in, const Tensor& out) = 0;
  virtual WorkPtr do_all_to_allv(const Tensor& in, std::vector<int64_t> send_rows,
                                 const Tensor& out, std::vector<int64_t> recv_rows) = 0;
  virtual WorkPtr do_reduce_scatter_v(const Tensor& x, std::vector<int64_t> counts,
                                      ReduceOp op) = 0;
  virtual WorkPtr do_all_gather_v(const Tensor& x, std::vector<int64_t> counts) = 0;
  virtual WorkPtr do_broadcast(const Tensor& x, int root) = 0;
  virtual WorkPtr do_send(const Tensor& x, int dst, int tag) = 0;
  virtual WorkPtr do_recv(const Tensor& x, int src, int tag) = 0;
  virtual WorkPtr do_barrier() = 0;

  uint64_t next_seq() { return ++seq_; }

 private:
  void check_reduce(const Tensor& t, ReduceOp op, const char* what, const char* name) const;
  void check_buffer(const Tensor& t, const char* what, const char* name) const;
  void check_peer(int peer, const char* what) const;
  void check_counts(const Tensor& x, std::span<const int64_t> counts, const char* what) const;

  std::string name_;
  std::vector<int> world_ranks_;
  int rank_;
  double timeout_s_;
  uint64_t seq_ = 0;
};

}  // namespace nk::dist
