// MpiWork: one pending MPI operation, posted non-blocking (MPI_Iallreduce,
// MPI_Isend, ...) because MPI's blocking calls cannot time out; wait() polls
// MPI_Testall (which also drives MPI's progress) through timed_wait, whose
// deadline counts from the wait, not the post: a bucket posted early and
// waited late is not penalised for the compute in between.
#pragma once
#include <mpi.h>

#include <functional>
#include <vector>

#include "dist/communicator.h"
#include "dist/mpi/state.h"

namespace nk::dist::mpi {

class MpiCommunicator;

class MpiWork final : public Work {
 public:
  // collective: every other group member is probed on timeout; otherwise `peers`.
  MpiWork(MpiCommunicator& comm, const char* op, uint64_t seq, std::vector<int> peers);
  ~MpiWork() override;

  void wait() override;
  bool test() override;

  // Filled by the communicator when it posts the operation.
  std::vector<MPI_Request> requests;
  std::vector<Tensor> keep;              // buffers in flight, kept alive
  std::vector<int> ints;                 // counts and displacements MPI reads until completion
  std::vector<float> staging;            // 16-bit data widened to f32
  std::function<void(MpiWork&)> finish;  // after completion: narrow, divide, check counts
  std::vector<MPI_Status> statuses;
  // "rank 1 (world 1), group 'tp' all_reduce #4"
  std::string where() const;

 private:
  bool poll();  // one MPI_Testall; runs finish once complete

  MpiCommunicator& comm_;
  const char* op_;
  uint64_t seq_;
  std::vector<int> peers_;  // group ranks
  bool done_ = false;
};

}  // namespace nk::dist::mpi
