#include "dist/nccl/nccl_groups.h"

#include "dist/nccl/nccl_communicator.h"

namespace nk::dist {

// In the name order of ProcessGroups on every rank: each init is collective
// only over its group, and one global order (a rank skipping the groups it is
// not in) cannot deadlock.
ProcessGroups make_nccl_groups(const ProcessGroups& mpi_groups, int device) {
  ProcessGroups out;
  for (auto& name : mpi_groups.names()) {
    auto* m = dynamic_cast<mpi::MpiCommunicator*>(&mpi_groups.get(name));
    if (!m) fail("group '{}': NCCL is bootstrapped over MPI communicators", name);
    out.add(std::make_unique<nccl::NcclCommunicator>(*m, device));
  }
  return out;
}

}  // namespace nk::dist
