// MpiRuntime: the MPI side of one process (launched by mpirun or srun, rank and
// size from MPI's environment; a plain start is a world of one). Create exactly
// one, first thing in main, and keep it alive longer than every Communicator.
//
// MPI errors are returned, not fatal (MPI_ERRORS_RETURN on every communicator),
// and become nk::Error with the rank, group and operation. After a timeout or a
// transport error MPI cannot be finished normally (MPI_Finalize would wait for
// the lost peer), so the runtime then ends the job with MPI_Abort instead: at
// destruction, or at once through abort().
#pragma once
#include <memory>
#include <string>

#include "dist/mesh.h"
#include "dist/process_groups.h"

namespace nk::dist {

namespace mpi {
struct State;
}

class MpiRuntime {
 public:
  // argc/argv may be null. Throws nk::Error if MPI was initialised already.
  explicit MpiRuntime(int* argc = nullptr, char*** argv = nullptr);
  // A timed barrier over the world (the timeout of the last make_groups), then
  // MPI_Finalize; MPI_Abort(1) instead if anything failed (a timeout, an MPI
  // error, mark_failed(), an exception unwinding through here) or if a peer
  // never reaches the barrier: ranks leave the job together or not at all.
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int rank() const;
  int world_size() const;

  // One communicator per group of `mesh` this rank belongs to, each with
  // `timeout_s`. Collective over the world: every rank calls it with the same
  // layout. A timed barrier runs first, so a rank that never arrives is named
  // rather than waited on forever. `timeout_s` also becomes the runtime's own
  // (its barriers, at exit too).
  ProcessGroups make_groups(const Mesh& mesh, double timeout_s);

  // Declares the job failed: the destructor will abort it rather than finalize.
  // For a caller that caught an error and is about to return non-zero.
  void mark_failed();
  bool failed() const;
  // Prints "nekton rank R: msg" to stderr and ends every process of the job with `code`.
  [[noreturn]] void abort(const std::string& msg, int code = 1);

 private:
  void world_barrier(double timeout_s);
  std::shared_ptr<mpi::State> state_;
};

}  // namespace nk::dist
