// MpiCommunicator: a Communicator over one MPI sub-communicator (MPI_Comm_split
// of the world per Mesh group, made by MpiRuntime::make_groups). CPU tensors.
#pragma once
#include <mpi.h>

#include <memory>
#include <mutex>
#include <vector>

#include "dist/communicator.h"
#include "dist/mpi/mpi_work.h"
#include "dist/mpi/state.h"

namespace nk::dist::mpi {

class MpiCommunicator final : public Communicator {
 public:
  // Frees `comm` with this object (while MPI is up) if it owns it.
  MpiCommunicator(std::string name, std::vector<int> world_ranks, int rank, double timeout_s,
                  MPI_Comm comm, std::shared_ptr<State> state, bool owns_comm = true);
  ~MpiCommunicator() override;

  State& state() const { return *state_; }

  // The f32 staging of 16-bit reductions (n floats, contents undefined),
  // from a small pool of buffers that completed works give back: a fresh
  // buffer per call has its pages faulted in and zeroed every time, and
  // glibc hands large freed blocks back to the OS (tensor parallelism's
  // all-reduces of 1 MiB lost 15 ms a step so on the 2-core box). At most 4
  // buffers of up to 16 MiB each are kept.
  std::vector<float> take_staging(size_t n);
  void give_back_staging(std::vector<float>&& v);

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
  // A Work for the next sequence number; peers: who to probe on timeout (empty: the whole group).
  std::unique_ptr<MpiWork> start(const char* op, std::vector<int> peers = {});
  // Checks a post's return code; the work then holds one more request.
  void posted(MpiWork& w, int rc);
  void check_device(const Tensor& t, const char* op) const;

  MPI_Comm comm_;
  std::shared_ptr<State> state_;
  bool owns_comm_;
  std::mutex pool_mu_;
  std::vector<std::vector<float>> pool_;  // at most kPooled, largest last
};

}  // namespace nk::dist::mpi
