// NcclCommunicator: a Communicator over one NCCL communicator and its CUDA
// stream, beside the MPI communicator of the same group (its bootstrap and
// liveness channel). See nccl_groups.h.
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include "dist/mpi/mpi_communicator.h"

namespace nk::dist::nccl {

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(mpi::MpiCommunicator& mpi, int device);
  ~NcclCommunicator() override;

  // Throws nk::Error "<where>: NCCL error: <text>" (aborting the communicator)
  // unless r is ncclSuccess; waits out ncclInProgress of a non-blocking call.
  void check(ncclResult_t r, const char* op, uint64_t seq);
  ncclComm_t comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }
  mpi::State& state() const { return mpi_.state(); }
  // Marks the communicator unusable and aborts its kernels (after a timeout or error).
  void abort();

 protected:
  WorkPtr do_all_reduce(const Tensor& x, ReduceOp op) override;
  WorkPtr do_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override;
  WorkPtr do_all_gather(const Tensor& in, const Tensor& out) override;
  WorkPtr do_all_to_all(const Tensor& in, const Tensor& out) override;
  WorkPtr do_all_to_allv(const Tensor& in, std::vector<int64_t> send_rows, const Tensor& out,
                         std::vector<int64_t> recv_rows) override;
  WorkPtr do_reduce_scatter_v(const Tensor& x, std::vector<int64_t> counts, ReduceOp op) override;
  WorkPtr do_all_gather_v(const Tensor& x, std::vector<int64_t> counts) override;
  WorkPtr do_broadcast(const Tensor& x, int root) override;
  WorkPtr do_send(const Tensor& x, int dst, int tag) override;
  WorkPtr do_recv(const Tensor& x, int src, int tag) override;
  WorkPtr do_barrier() override;

 private:
  // Records the end of the operation just enqueued; the Work keeps `keep` alive.
  WorkPtr finish(const char* op, uint64_t seq, std::vector<Tensor> keep,
                 std::vector<int> peers = {});
  void check_device(const Tensor& t, const char* op) const;

  mpi::MpiCommunicator& mpi_;
  int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* barrier_word_ = nullptr;  // one device float all-reduced by barrier()
  bool aborted_ = false;
};

}  // namespace nk::dist::nccl
