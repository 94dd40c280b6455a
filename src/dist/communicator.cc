#include "dist/communicator.h"

#include <algorithm>
#include <numeric>

namespace nk::dist {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Max:
      return "max";
  }
  return "?";
}

Communicator::Communicator(std::string name, std::vector<int> world_ranks, int rank,
                           double timeout_s)
    : name_(std::move(name)), world_ranks_(std::move(world_ranks)), rank_(rank) {
  NK_CHECK(rank_ >= 0 && rank_ < size(), "rank {} outside group '{}' of {}", rank_, name_, size());
  set_timeout(timeout_s);
}

void Communicator::set_timeout(double seconds) {
  if (!(seconds > 0)) fail("group '{}': the timeout must be positive, got {} s", name_, seconds);
  timeout_s_ = seconds;
}

std::string Communicator::where(const char* op, uint64_t seq) const {
  std::string s =
      fmt::format("rank {} (world {}), group '{}' {}", rank_, world_ranks_[rank_], name_, op);
  return seq ? s + fmt::format(" #{}", seq) : s;
}

void Communicator::check_buffer(const Tensor& t, const char* what, const char* name) const {
  if (!t.defined()) fail("{}: {} is undefined", where(what, 0), name);
  if (!t.is_contiguous()) fail("{}: {} {} is not contiguous", where(what, 0), name, t.desc());
}

void Communicator::check_reduce(const Tensor& t, ReduceOp op, const char* what,
                                const char* name) const {
  check_buffer(t, what, name);
  switch (t.dtype()) {
    case DType::F32:
    case DType::F64:
    case DType::BF16:
    case DType::F16:
      return;
    case DType::I32:
    case DType::I64:
      if (op == ReduceOp::Avg) fail("{}: avg of integer {} {}", where(what, 0), name, t.desc());
      return;
    default:
      fail("{}: cannot reduce {} {}", where(what, 0), name, t.desc());
  }
}

void Communicator::check_peer(int peer, const char* what) const {
  if (peer < 0 || peer >= size())
    fail("{}: peer rank {} is outside the group of {}", where(what, 0), peer, size());
}

WorkPtr Communicator::all_reduce_async(const Tensor& x, ReduceOp op) {
  check_reduce(x, op, "all_reduce", "x");
  return do_all_reduce(x, op);
}

WorkPtr Communicator::reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) {
  check_reduce(in, op, "reduce_scatter", "in");
  check_buffer(out, "reduce_scatter", "out");
  if (in.dtype() != out.dtype() || in.numel() != out.numel() * size())
    fail("{}: in {} must hold {} × out {}", where("reduce_scatter", 0), in.desc(), size(),
         out.desc());
  return do_reduce_scatter(in, out, op);
}

WorkPtr Communicator::all_gather_async(const Tensor& in, const Tensor& out) {
  check_buffer(in, "all_gather", "in");
  check_buffer(out, "all_gather", "out");
  if (in.dtype() != out.dtype() || out.numel() != in.numel() * size())
    fail("{}: out {} must hold {} × in {}", where("all_gather", 0), out.desc(), size(), in.desc());
  return do_all_gather(in, out);
}

WorkPtr Communicator::all_to_all_async(const Tensor& in, const Tensor& out) {
  check_buffer(in, "all_to_all", "in");
  check_buffer(out, "all_to_all", "out");
  if (in.dtype() != out.dtype() || in.numel() != out.numel() || in.numel() % size() != 0)
    fail("{}: in {} and out {} must be equal and split into {} blocks", where("all_to_all", 0),
         in.desc(), out.desc(), size());
  return do_all_to_all(in, out);
}

WorkPtr Communicator::all_to_allv_async(const Tensor& in, std::span<const int64_t> send_rows,
                                        const Tensor& out, std::span<const int64_t> recv_rows) {
  const char* op = "all_to_allv";
  check_buffer(in, op, "in");
  check_buffer(out, op, "out");
  if (int(send_rows.size()) != size() || int(recv_rows.size()) != size())
    fail("{}: {} send and {} receive counts for a group of {}", where(op, 0), send_rows.size(),
         recv_rows.size(), size());
  if (in.dtype() != out.dtype() || in.ndim() < 1 || out.ndim() < 1 ||
      !std::equal(in.shape().begin() + 1, in.shape().end(), out.shape().begin() + 1,
                  out.shape().end()))
    fail("{}: in {} and out {} must have the same dtype and row shape", where(op, 0), in.desc(),
         out.desc());
  for (auto c : send_rows)
    if (c < 0) fail("{}: negative send count {}", where(op, 0), c);
  for (auto c : recv_rows)
    if (c < 0) fail("{}: negative receive count {}", where(op, 0), c);
  int64_t sent = std::accumulate(send_rows.begin(), send_rows.end(), int64_t(0));
  int64_t received = std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t(0));
  if (sent != in.dim(0) || received != out.dim(0))
    fail("{}: counts add up to {} sent and {} received rows, buffers are in {} and out {}",
         where(op, 0), sent, received, in.desc(), out.desc());
  return do_all_to_allv(in, {send_rows.begin(), send_rows.end()}, out,
                        {recv_rows.begin(), recv_rows.end()});
}

void Communicator::check_counts(const Tensor& x, std::span<const int64_t> counts,
                                const char* what) const {
  if (int(counts.size()) != size())
    fail("{}: {} counts for a group of {}", where(what, 0), counts.size(), size());
  for (auto c : counts)
    if (c < 0) fail("{}: negative count {}", where(what, 0), c);
  int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0));
  if (total != x.numel())
    fail("{}: counts add up to {} elements, x is {}", where(what, 0), total, x.desc());
}

WorkPtr Communicator::reduce_scatter_v_async(const Tensor& x, std::span<const int64_t> counts,
                                             ReduceOp op) {
  check_reduce(x, op, "reduce_scatter_v", "x");
  check_counts(x, counts, "reduce_scatter_v");
  return do_reduce_scatter_v(x, {counts.begin(), counts.end()}, op);
}

WorkPtr Communicator::all_gather_v_async(const Tensor& x, std::span<const int64_t> counts) {
  check_buffer(x, "all_gather_v", "x");
  check_counts(x, counts, "all_gather_v");
  return do_all_gather_v(x, {counts.begin(), counts.end()});
}

WorkPtr Communicator::broadcast_async(const Tensor& x, int root) {
  check_buffer(x, "broadcast", "x");
  check_peer(root, "broadcast");
  return do_broadcast(x, root);
}

WorkPtr Communicator::send_async(const Tensor& x, int dst, int tag) {
  check_buffer(x, "send", "x");
  check_peer(dst, "send");
  if (dst == rank_) fail("{}: send to itself", where("send", 0));
  if (tag < 0 || tag > 32767) fail("{}: tag {} outside [0, 32767]", where("send", 0), tag);
  return do_send(x, dst, tag);
}

WorkPtr Communicator::recv_async(const Tensor& x, int src, int tag) {
  check_buffer(x, "recv", "x");
  check_peer(src, "recv");
  if (src == rank_) fail("{}: receive from itself", where("recv", 0));
  if (tag < 0 || tag > 32767) fail("{}: tag {} outside [0, 32767]", where("recv", 0), tag);
  return do_recv(x, src, tag);
}

WorkPtr Communicator::barrier_async() {
  return do_barrier();
}

}  // namespace nk::dist
