#include "dist/nccl/nccl_communicator.h"

#include "dist/nccl/nccl_api.h"

#include "dist/mpi/timed_wait.h"

namespace nk::dist::nccl {

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F16:
      return ncclFloat16;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::U8:
      return ncclUint8;
  }
  NK_CHECK(false, "dtype {}", int(t));
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::Sum ? ncclSum : op == ReduceOp::Avg ? ncclAvg : ncclMax;
}

void cuda_check(cudaError_t e, const std::string& where) {
  if (e != cudaSuccess) fail("{}: CUDA error: {}", where, cudaGetErrorString(e));
}

// One enqueued operation: done when the CUDA event after it has passed.
class NcclWork final : public Work {
 public:
  NcclWork(NcclCommunicator& c, const char* op, uint64_t seq, std::vector<Tensor> keep,
           std::vector<int> peers)
      : c_(c), op_(op), seq_(seq), keep_(std::move(keep)), peers_(std::move(peers)) {
    cuda_check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), c_.where(op_, seq_));
    cuda_check(cudaEventRecord(event_, c_.stream()), c_.where(op_, seq_));
  }
  ~NcclWork() override {
    if (!done_ && !c_.state().failed) {
      try {
        wait();
      } catch (const std::exception& e) {
        c_.state().abort(e.what(), 1);
      }
    }
    cudaEventDestroy(event_);
  }
  bool test() override { return done_ || poll(); }
  void wait() override {
    if (done_) return;
    try {
      mpi::timed_wait(c_, c_.state(), op_, seq_, peers_, [this] { return poll(); });
    } catch (...) {
      c_.abort();  // its kernels would otherwise spin on the GPU forever
      throw;
    }
  }

 private:
  bool poll() {
    ncclResult_t async = ncclSuccess;
    nccl_api().ncclCommGetAsyncError(c_.comm(), &async);
    if (async != ncclSuccess && async != ncclInProgress) c_.check(async, op_, seq_);
    cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) return false;
    cuda_check(e, c_.where(op_, seq_));
    done_ = true;
    return true;
  }

  NcclCommunicator& c_;
  const char* op_;
  uint64_t seq_;
  std::vector<Tensor> keep_;
  std::vector<int> peers_;
  cudaEvent_t event_ = nullptr;
  bool done_ = false;
};

}  // namespace

NcclCommunicator::NcclCommunicator(mpi::MpiCommunicator& mpi, int device)
    : Communicator(mpi.name(), mpi.world_ranks(), mpi.rank(), mpi.timeout()),
      mpi_(mpi),
      device_(device) {
  std::string at = where("nccl init", 0);
  nccl_api();  // each rank opens NCCL first: one without it fails here, not in rank 0's broadcast
  cuda_check(cudaSetDevice(device_), at);
  ncclUniqueId id{};
  if (rank() == 0) check(nccl_api().ncclGetUniqueId(&id), "nccl init", 0);
  mpi_.broadcast(Tensor::from_blob(&id, {int64_t(sizeof id)}, DType::U8), 0);
  cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), at);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; check() waits with the timeout
  check(nccl_api().ncclCommInitRankConfig(&comm_, size(), id, rank(), &config), "nccl init", 0);
  cuda_check(cudaMalloc(&barrier_word_, sizeof(float)), at);
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_) {
    if (aborted_ || state().failed)
      nccl_api().ncclCommAbort(comm_);
    else
      nccl_api().ncclCommDestroy(comm_);
  }
  if (barrier_word_) cudaFree(barrier_word_);
  if (stream_) cudaStreamDestroy(stream_);
}

void NcclCommunicator::abort() {
  if (aborted_ || !comm_) return;
  aborted_ = true;
  state().failed = true;
  nccl_api().ncclCommAbort(comm_);
}

void NcclCommunicator::check(ncclResult_t r, const char* op, uint64_t seq) {
  if (r == ncclInProgress) {
    try {
      mpi::timed_wait(*this, state(), op, seq, {}, [&] {
        nccl_api().ncclCommGetAsyncError(comm_, &r);
        return r != ncclInProgress;
      });
    } catch (...) {
      abort();
      throw;
    }
  }
  if (r == ncclSuccess) return;
  std::string msg =
      fmt::format("{}: NCCL error: {} ({})", where(op, seq), nccl_api().ncclGetErrorString(r),
                  comm_ ? nccl_api().ncclGetLastError(comm_) : "");
  abort();
  state().failed = true;
  throw Error(msg);
}

void NcclCommunicator::check_device(const Tensor& t, const char* op) const {
  if (t.device() != Device::CUDA)
    fail("{}: the NCCL backend needs CUDA tensors, got one on {}", where(op, 0),
         device_name(t.device()));
  if (aborted_) fail("{}: the communicator was aborted after an earlier failure", where(op, 0));
}

WorkPtr NcclCommunicator::finish(const char* op, uint64_t seq, std::vector<Tensor> keep,
                                 std::vector<int> peers) {
  return std::make_unique<NcclWork>(*this, op, seq, std::move(keep), std::move(peers));
}

WorkPtr NcclCommunicator::do_all_reduce(const Tensor& x, ReduceOp op) {
  check_device(x, "all_reduce");
  uint64_t seq = next_seq();
  check(nccl_api().ncclAllReduce(x.raw(), x.raw(), size_t(x.numel()), nccl_type(x.dtype()),
                                 nccl_op(op), comm_, stream_),
        "all_reduce", seq);
  return finish("all_reduce", seq, {x});
}

WorkPtr NcclCommunicator::do_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) {
  check_device(in, "reduce_scatter");
  check_device(out, "reduce_scatter");
  uint64_t seq = next_seq();
  check(nccl_api().ncclReduceScatter(in.raw(), out.raw(), size_t(out.numel()),
                                     nccl_type(in.dtype()), nccl_op(op), comm_, stream_),
        "reduce_scatter", seq);
  return finish("reduce_scatter", seq, {in, out});
}

WorkPtr NcclCommunicator::do_all_gather(const Tensor& in, const Tensor& out) {
  check_device(in, "all_gather");
  check_device(out, "all_gather");
  uint64_t seq = next_seq();
  check(nccl_api().ncclAllGather(in.raw(), out.raw(), size_t(in.numel()), nccl_type(in.dtype()),
                                 comm_, stream_),
        "all_gather", seq);
  return finish("all_gather", seq, {in, out});
}

WorkPtr NcclCommunicator::do_all_to_all(const Tensor& in, const Tensor& out) {
  std::vector<int64_t> rows(size(), in.numel() / size());
  return do_all_to_allv(in.view({in.numel()}), rows, out.view({out.numel()}), rows);
}

// NCCL has no all-to-all: one send and one receive per peer in a group call.
WorkPtr NcclCommunicator::do_all_to_allv(const Tensor& in, std::vector<int64_t> send_rows,
                                         const Tensor& out, std::vector<int64_t> recv_rows) {
  check_device(in, "all_to_allv");
  check_device(out, "all_to_allv");
  uint64_t seq = next_seq();
  int64_t row = 1;  // elements per row (dim 0); in and out share the row shape
  for (int i = 1; i < in.ndim(); ++i) row *= in.dim(i);
  auto type = nccl_type(in.dtype());
  size_t esize = dtype_size(in.dtype());
  char* src = static_cast<char*>(in.raw());
  char* dst = static_cast<char*>(out.raw());
  check(nccl_api().ncclGroupStart(), "all_to_allv", seq);
  for (int j = 0; j < size(); ++j) {
    size_t sn = size_t(send_rows[j] * row), rn = size_t(recv_rows[j] * row);
    if (sn) check(nccl_api().ncclSend(src, sn, type, j, comm_, stream_), "all_to_allv", seq);
    if (rn) check(nccl_api().ncclRecv(dst, rn, type, j, comm_, stream_), "all_to_allv", seq);
    src += sn * esize;
    dst += rn * esize;
  }
  check(nccl_api().ncclGroupEnd(), "all_to_allv", seq);
  return finish("all_to_allv", seq, {in, out});
}

// NCCL has no uneven reduce-scatter or all-gather: one reduce (all-gather:
// one broadcast) per block, rooted at its owner, in a group call, in place.
WorkPtr NcclCommunicator::do_reduce_scatter_v(const Tensor& x, std::vector<int64_t> counts,
                                              ReduceOp op) {
  check_device(x, "reduce_scatter_v");
  uint64_t seq = next_seq();
  auto type = nccl_type(x.dtype());
  char* at = static_cast<char*>(x.raw());
  const size_t esize = dtype_size(x.dtype());
  check(nccl_api().ncclGroupStart(), "reduce_scatter_v", seq);
  for (int j = 0; j < size(); ++j) {
    const size_t n = size_t(counts[size_t(j)]);
    if (n)
      check(nccl_api().ncclReduce(at, at, n, type, nccl_op(op), j, comm_, stream_),
            "reduce_scatter_v", seq);
    at += n * esize;
  }
  check(nccl_api().ncclGroupEnd(), "reduce_scatter_v", seq);
  return finish("reduce_scatter_v", seq, {x});
}

WorkPtr NcclCommunicator::do_all_gather_v(const Tensor& x, std::vector<int64_t> counts) {
  check_device(x, "all_gather_v");
  uint64_t seq = next_seq();
  auto type = nccl_type(x.dtype());
  char* at = static_cast<char*>(x.raw());
  const size_t esize = dtype_size(x.dtype());
  check(nccl_api().ncclGroupStart(), "all_gather_v", seq);
  for (int j = 0; j < size(); ++j) {
    const size_t n = size_t(counts[size_t(j)]);
    if (n) check(nccl_api().ncclBroadcast(at, at, n, type, j, comm_, stream_), "all_gather_v", seq);
    at += n * esize;
  }
  check(nccl_api().ncclGroupEnd(), "all_gather_v", seq);
  return finish("all_gather_v", seq, {x});
}

WorkPtr NcclCommunicator::do_broadcast(const Tensor& x, int root) {
  check_device(x, "broadcast");
  uint64_t seq = next_seq();
  check(nccl_api().ncclBroadcast(x.raw(), x.raw(), size_t(x.numel()), nccl_type(x.dtype()), root,
                                 comm_, stream_),
        "broadcast", seq);
  return finish("broadcast", seq, {x});
}

WorkPtr NcclCommunicator::do_send(const Tensor& x, int dst, int tag) {
  check_device(x, "send");
  if (tag != 0) fail("{}: NCCL has no message tags (got {})", where("send", 0), tag);
  uint64_t seq = next_seq();
  check(nccl_api().ncclSend(x.raw(), size_t(x.numel()), nccl_type(x.dtype()), dst, comm_, stream_),
        "send", seq);
  return finish("send", seq, {x}, {dst});
}

WorkPtr NcclCommunicator::do_recv(const Tensor& x, int src, int tag) {
  check_device(x, "recv");
  if (tag != 0) fail("{}: NCCL has no message tags (got {})", where("recv", 0), tag);
  uint64_t seq = next_seq();
  check(nccl_api().ncclRecv(x.raw(), size_t(x.numel()), nccl_type(x.dtype()), src, comm_, stream_),
        "recv", seq);
  return finish("recv", seq, {x}, {src});
}

WorkPtr NcclCommunicator::do_barrier() {
  uint64_t seq = next_seq();
  check(nccl_api().ncclAllReduce(barrier_word_, barrier_word_, 1, ncclFloat32, ncclSum, comm_,
                                 stream_),
        "barrier", seq);
  return finish("barrier", seq, {});
}

}  // namespace nk::dist::nccl
