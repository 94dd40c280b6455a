#include "dist/mpi/mpi_communicator.h"

#include <algorithm>
#include <cstring>

#include "dist/mpi/buffers.h"

namespace nk::dist::mpi {

namespace {

MPI_Op mpi_op(ReduceOp op) {
  return op == ReduceOp::Max ? MPI_MAX : MPI_SUM;
}

// The divisor that turns the reduced sum into op's result.
int divisor(ReduceOp op, int size) {
  return op == ReduceOp::Avg ? size : 1;
}

}  // namespace

MpiCommunicator::MpiCommunicator(std::string name, std::vector<int> world_ranks, int rank,
                                 double timeout_s, MPI_Comm comm, std::shared_ptr<State> state,
                                 bool owns_comm)
    : Communicator(std::move(name), std::move(world_ranks), rank, timeout_s),
      comm_(comm),
      state_(std::move(state)),
      owns_comm_(owns_comm) {}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_comm_ && !finalized && !state_->failed) MPI_Comm_free(&comm_);
}

namespace {
constexpr size_t kPooled = 4;  // staging buffers kept between calls
// Larger ones (a data-parallel bucket's) are freed: their fault-in is small
// against their transfer, and 4 of them held would be memory no estimate counts.
constexpr size_t kPooledFloats = size_t(4) << 20;  // 16 MiB
}  // namespace

std::vector<float> MpiCommunicator::take_staging(size_t n) {
  std::vector<float> v;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    // The smallest buffer that holds n, else the largest (grown below).
    auto it = std::find_if(pool_.begin(), pool_.end(),
                           [&](const std::vector<float>& b) { return b.capacity() >= n; });
    if (it == pool_.end() && !pool_.empty()) it = pool_.end() - 1;
    if (it != pool_.end()) {
      v = std::move(*it);
      pool_.erase(it);
    }
  }
  v.resize(n);  // shrinking keeps the bytes; only a grown tail is written
  return v;
}

void MpiCommunicator::give_back_staging(std::vector<float>&& v) {
  if (v.capacity() == 0 || v.capacity() > kPooledFloats) return;
  std::lock_guard<std::mutex> lock(pool_mu_);
  auto at =
      std::lower_bound(pool_.begin(), pool_.end(), v.capacity(),
                       [](const std::vector<float>& b, size_t c) { return b.capacity() < c; });
  pool_.insert(at, std::move(v));
  if (pool_.size() > kPooled) pool_.erase(pool_.begin());  // the smallest goes
}

void MpiCommunicator::check_device(const Tensor& t, const char* op) const {
  if (!t.on_host())
    fail("{}: the MPI backend needs host tensors, got one on {}", where(op, 0),
         device_name(t.device()));
}

std::unique_ptr<MpiWork> MpiCommunicator::start(const char* op, std::vector<int> peers) {
  return std::make_unique<MpiWork>(*this, op, next_seq(), std::move(peers));
}

void MpiCommunicator::posted(MpiWork& w, int rc) {
  check(*state_, rc, [&] { return w.where(); });
}

WorkPtr MpiCommunicator::do_all_reduce(const Tensor& x, ReduceOp op) {
  check_device(x, "all_reduce");
  auto w = start("all_reduce");
  int n = mpi_count(x.numel(), w->where());
  w->keep = {x};
  w->requests.emplace_back();
  if (is_16bit(x.dtype())) {
    w->staging = take_staging(size_t(n));
    widen(x, w->staging.data());
    posted(*w, MPI_Iallreduce(MPI_IN_PLACE, w->staging.data(), n, MPI_FLOAT, mpi_op(op), comm_,
                              &w->requests.back()));
    w->finish = [d = divisor(op, size())](MpiWork& w) { narrow(w.staging.data(), w.keep[0], d); };
  } else {
    posted(*w, MPI_Iallreduce(MPI_IN_PLACE, x.raw(), n, element_type(x.dtype()), mpi_op(op), comm_,
                              &w->requests.back()));
    if (op == ReduceOp::Avg) w->finish = [d = size()](MpiWork& w) { divide(w.keep[0], d); };
  }
  return w;
}

WorkPtr MpiCommunicator::do_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) {
  check_device(in, "reduce_scatter");
  check_device(out, "reduce_scatter");
  auto w = start("reduce_scatter");
  int n = mpi_count(out.numel(), w->where());
  mpi_count(in.numel(), w->where());
  w->keep = {in, out};
  w->requests.emplace_back();
  if (is_16bit(in.dtype())) {
    // staging = [in widened (size·n) | out (n)]
    w->staging = take_staging(size_t(in.numel()) + n);
    widen(in, w->staging.data());
    float* out32 = w->staging.data() + in.numel();
    posted(*w, MPI_Ireduce_scatter_block(w->staging.data(), out32, n, MPI_FLOAT, mpi_op(op), comm_,
                                         &w->requests.back()));
    w->finish = [d = divisor(op, size()), out32](MpiWork& w) { narrow(out32, w.keep[1], d); };
  } else {
    posted(*w, MPI_Ireduce_scatter_block(in.raw(), out.raw(), n, element_type(in.dtype()),
                                         mpi_op(op), comm_, &w->requests.back()));
    if (op == ReduceOp::Avg) w->finish = [d = size()](MpiWork& w) { divide(w.keep[1], d); };
  }
  return w;
}

WorkPtr MpiCommunicator::do_all_gather(const Tensor& in, const Tensor& out) {
  check_device(in, "all_gather");
  check_device(out, "all_gather");
  auto w = start("all_gather");
  int n = mpi_count(in.numel(), w->where());
  mpi_count(out.numel(), w->where());
  w->keep = {in, out};
  auto t = element_type(in.dtype());
  w->requests.emplace_back();
  posted(*w, MPI_Iallgather(in.raw(), n, t, out.raw(), n, t, comm_, &w->requests.back()));
  return w;
}

WorkPtr MpiCommunicator::do_all_to_all(const Tensor& in, const Tensor& out) {
  check_device(in, "all_to_all");
  check_device(out, "all_to_all");
  auto w = start("all_to_all");
  mpi_count(in.numel(), w->where());
  int block = int(in.numel() / size());
  w->keep = {in, out};
  auto t = element_type(in.dtype());
  w->requests.emplace_back();
  posted(*w, MPI_Ialltoall(in.raw(), block, t, out.raw(), block, t, comm_, &w->requests.back()));
  return w;
}

WorkPtr MpiCommunicator::do_all_to_allv(const Tensor& in, std::vector<int64_t> send_rows,
                                        const Tensor& out, std::vector<int64_t> recv_rows) {
  check_device(in, "all_to_allv");
  check_device(out, "all_to_allv");
  auto w = start("all_to_allv");
  mpi_count(in.numel(), w->where());
  mpi_count(out.numel(), w->where());
  int64_t row = 1;
  for (int i = 1; i < in.ndim(); ++i) row *= in.dim(i);
  // ints = [send counts | send displacements | receive counts | receive displacements]
  int p = size();
  w->ints.assign(4 * size_t(p), 0);
  int* sc = w->ints.data();
  int* sd = sc + p;
  int* rc = sd + p;
  int* rd = rc + p;
  for (int j = 0; j < p; ++j) {
    sc[j] = int(send_rows[j] * row);
    rc[j] = int(recv_rows[j] * row);
    if (j > 0) {
      sd[j] = sd[j - 1] + sc[j - 1];
      rd[j] = rd[j - 1] + rc[j - 1];
    }
  }
  w->keep = {in, out};
  auto t = element_type(in.dtype());
  w->requests.emplace_back();
  posted(*w, MPI_Ialltoallv(in.raw(), sc, sd, t, out.raw(), rc, rd, t, comm_, &w->requests.back()));
  return w;
}

// MPI_Ireduce_scatter in place leaves this rank's block at the start of the
// buffer; finish() moves it to the block's own place.
WorkPtr MpiCommunicator::do_reduce_scatter_v(const Tensor& x, std::vector<int64_t> counts,
                                             ReduceOp op) {
  check_device(x, "reduce_scatter_v");
  auto w = start("reduce_scatter_v");
  mpi_count(x.numel(), w->where());
  const int p = size(), me = rank();
  w->ints.resize(size_t(p));
  int64_t at = 0;  // this rank's block starts here
  for (int j = 0; j < p; ++j) {
    w->ints[size_t(j)] = int(counts[size_t(j)]);
    if (j < me) at += counts[size_t(j)];
  }
  const int64_t n = counts[size_t(me)];
  w->keep = {x};
  w->requests.emplace_back();
  if (is_16bit(x.dtype())) {
    // staging = [x widened | this rank's block]
    w->staging = take_staging(size_t(x.numel() + n));
    widen(x, w->staging.data());
    float* out32 = w->staging.data() + x.numel();
    posted(*w, MPI_Ireduce_scatter(w->staging.data(), out32, w->ints.data(), MPI_FLOAT, mpi_op(op),
                                   comm_, &w->requests.back()));
    w->finish = [d = divisor(op, p), out32, at, n](MpiWork& w) {
      narrow(out32, w.keep[0].narrow0(at, n), d);
    };
  } else {
    posted(*w, MPI_Ireduce_scatter(MPI_IN_PLACE, x.raw(), w->ints.data(), element_type(x.dtype()),
                                   mpi_op(op), comm_, &w->requests.back()));
    w->finish = [d = divisor(op, p), at, n](MpiWork& w) {
      const Tensor& x = w.keep[0];
      const size_t es = dtype_size(x.dtype());
      char* base = static_cast<char*>(x.raw());
      if (at > 0 && n > 0) std::memmove(base + at * es, base, size_t(n) * es);
      if (d != 1 && n > 0) divide(x.narrow0(at, n), d);
    };
  }
  return w;
}

WorkPtr MpiCommunicator::do_all_gather_v(const Tensor& x, std::vector<int64_t> counts) {
  check_device(x, "all_gather_v");
  auto w = start("all_gather_v");
  mpi_count(x.numel(), w->where());
  const int p = size();
  // ints = [counts | displacements]
  w->ints.assign(2 * size_t(p), 0);
  for (int j = 0; j < p; ++j) {
    w->ints[size_t(j)] = int(counts[size_t(j)]);
    if (j > 0) w->ints[size_t(p + j)] = w->ints[size_t(p + j - 1)] + w->ints[size_t(j - 1)];
  }
  w->keep = {x};
  w->requests.emplace_back();
  posted(*w,
         MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x.raw(), w->ints.data(),
                         w->ints.data() + p, element_type(x.dtype()), comm_, &w->requests.back()));
  return w;
}

WorkPtr MpiCommunicator::do_broadcast(const Tensor& x, int root) {
  check_device(x, "broadcast");
  auto w = start("broadcast");
  int n = mpi_count(x.numel(), w->where());
  w->keep = {x};
  w->requests.emplace_back();
  posted(*w, MPI_Ibcast(x.raw(), n, element_type(x.dtype()), root, comm_, &w->requests.back()));
  return w;
}

WorkPtr MpiCommunicator::do_send(const Tensor& x, int dst, int tag) {
  check_device(x, "send");
  auto w = start("send", {dst});
  int n = mpi_count(x.numel(), w->where());
  w->keep = {x};
  w->requests.emplace_back();
  posted(*w, MPI_Isend(x.raw(), n, element_type(x.dtype()), dst, tag, comm_, &w->requests.back()));
  return w;
}

WorkPtr MpiCommunicator::do_recv(const Tensor& x, int src, int tag) {
  check_device(x, "recv");
  auto w = start("recv", {src});
  int n = mpi_count(x.numel(), w->where());
  w->keep = {x};
  w->requests.emplace_back();
  posted(*w, MPI_Irecv(x.raw(), n, element_type(x.dtype()), src, tag, comm_, &w->requests.back()));
  // A longer message fails as MPI_ERR_TRUNCATE; a shorter one is caught here.
  w->finish = [n, src](MpiWork& w) {
    int got = 0;
    MPI_Get_count(&w.statuses[0], element_type(w.keep[0].dtype()), &got);
    if (got != n)
      fail("{}: received {} elements from rank {}, the buffer {} expects {}", w.where(), got, src,
           w.keep[0].desc(), n);
  };
  return w;
}

WorkPtr MpiCommunicator::do_barrier() {
  auto w = start("barrier");
  w->requests.emplace_back();
  posted(*w, MPI_Ibarrier(comm_, &w->requests.back()));
  return w;
}

}  // namespace nk::dist::mpi
