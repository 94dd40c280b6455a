// The MPI process state shared by the runtime and every MPI communicator.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>

#include "core/error.h"
#include "dist/mpi/liveness.h"

namespace nk::dist::mpi {

struct State {
  int rank = 0, size = 1;
  MPI_Comm control = MPI_COMM_NULL;  // liveness probes only
  std::unique_ptr<Liveness> liveness;
  // Set by a timeout or an MPI error: MPI can no longer be finished normally.
  bool failed = false;
  double timeout_s = 300;  // of the barriers the runtime itself runs (set by make_groups)

  // Prints "nekton rank R: msg" to stderr, then MPI_Abort(code).
  [[noreturn]] void abort(const std::string& msg, int code);
};

// MPI's text for an error code.
std::string error_text(int rc);

// Throws nk::Error "<where()>: MPI error: <text>" and marks the state failed
// unless rc is MPI_SUCCESS.
template <class Where>
void check(State& s, int rc, Where&& where) {
  if (rc == MPI_SUCCESS) return;
  s.failed = true;
  throw Error(where() + ": MPI error: " + error_text(rc));
}

}  // namespace nk::dist::mpi
