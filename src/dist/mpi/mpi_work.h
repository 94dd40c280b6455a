// MpiWork: one pending MPI operation (non-blocking MPI requests) and the wait
// loop that bounds it in time.
//
// MPI's blocking calls cannot time out, so every operation is posted
// non-blocking (MPI_Iallreduce, MPI_Isend, ...) and wait() polls MPI_Testall,
// which also drives MPI's progress, until it completes or `timeout` seconds
// have passed since wait() began (not since the post: a bucket posted early and
// waited late is not penalised for the compute in between). Each poll also
// answers liveness probes (liveness.h). Polls run back to back, yielding the
// core, for the first second (MPI's non-blocking collectives progress only
// inside MPI calls, so sleeping would slow every round of their algorithm),
// then every 20 µs growing to 1 ms: a longer wait is a wait for a straggler,
// and the cores are better left to the ranks still computing.
//
// On timeout the rank probes the operation's peers for a grace period of a
// quarter of the timeout (0.2 s to 2 s), marks the runtime failed and throws
// TimeoutError: "rank 0 (world 0), group 'world' all_reduce #3 timed out after
// 2.0 s: missing rank 2 (world 2): no answer (dead, hung, or busy outside any
// collective)".
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
  [[noreturn]] void timed_out();

  MpiCommunicator& comm_;
  const char* op_;
  uint64_t seq_;
  std::vector<int> peers_;  // group ranks
  bool done_ = false;
};

}  // namespace nk::dist::mpi
