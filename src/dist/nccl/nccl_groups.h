// NCCL communicators for GPU tensors, one per MPI group, bootstrapped over MPI
// (rank 0 of each group makes the ncclUniqueId, the group's MPI communicator
// broadcasts it, under the group's timeout). Built only with -DNK_WITH_NCCL=ON
// (needs the CUDA toolkit's NCCL); this machine has none of it at run time, so
// it is compiled, not yet tested.
//
// Same Communicator interface and the same timeout guarantee as MPI: NCCL runs
// non-blocking (ncclConfig_t.blocking = 0); each operation records a CUDA
// event on the communicator's stream, and wait() polls the event and
// ncclCommGetAsyncError through mpi::timed_wait, so the missing ranks are
// found by the same MPI liveness probes; a timed-out communicator is aborted
// (ncclCommAbort) so no kernel spins forever on the GPU.
//
// Dtypes: NCCL's own, f32, f64, bf16, f16, i32, i64, u8; bf16/f16 sums are
// NCCL's (reduced pairwise in the 16-bit type's storage, rounded at each step),
// unlike the MPI backend's single rounding. send/recv have no tags (NCCL
// matches messages between a pair in order): a non-zero tag is refused.
#pragma once
#include "dist/process_groups.h"

namespace nk::dist {

// One NCCL communicator per MPI communicator of `mpi_groups` (the same group
// names, ranks and timeouts), on CUDA device `device`. Collective over the
// world like MpiRuntime::make_groups; the MPI groups must outlive the result.
ProcessGroups make_nccl_groups(const ProcessGroups& mpi_groups, int device);

}  // namespace nk::dist
