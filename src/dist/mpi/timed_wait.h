// The one wait loop of every backend that runs beside MPI (MPI itself, NCCL):
// it bounds an operation in time and, past the deadline, finds and names the
// missing ranks (liveness.h).
//
// `done` is polled until it returns true: back to back (yielding the core) for
// the first second, since MPI's non-blocking collectives progress only inside
// MPI calls and any sleep would stretch every round of their algorithm; then
// every 20 µs growing to 1 ms, since a longer wait is a wait for a straggler
// and the cores are better left to the ranks still computing. Liveness probes
// are answered once per millisecond at most (a prober waits 0.2 s or more).
//
// Past `comm.timeout()` seconds from the call, the peers are probed for a
// grace period of a quarter of the timeout (0.2 s to 2 s), the runtime is
// marked failed and TimeoutError is thrown:
//   "rank 0 (world 2), group 'tp' all_reduce #2 timed out after 2.0 s: missing
//    rank 1 (world 3): no answer (dead, hung, or busy outside any collective)
//    (0 of 1 peers arrived)"
#pragma once
#include <functional>
#include <vector>

#include "dist/communicator.h"
#include "dist/mpi/state.h"

namespace nk::dist::mpi {

// peers: group ranks a point-to-point operation waits on; empty for a
// collective (every other member, and those waiting in the same op count as arrived).
void timed_wait(const Communicator& comm, State& state, const char* op, uint64_t seq,
                const std::vector<int>& peers, const std::function<bool()>& done);

}  // namespace nk::dist::mpi
