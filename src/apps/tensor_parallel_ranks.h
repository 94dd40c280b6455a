// The processes of an inference command split by tensor parallelism
// (generate.tp, serve.tp: vLLM's --tensor-parallel-size): one group of tp
// ranks, each holding its share of the model, rank 0 answering the user.
#pragma once
#include <string>
#include <vector>

#include "dist/mesh.h"
#include "dist/mpi/runtime.h"
#include "dist/process_groups.h"
#include "nn/tensor_parallel.h"

namespace nk {

// Before MPI starts, for the command `command` whose arguments (after its
// name) are `args`: with --nproc N (nproc > 0) outside mpirun, starts the
// command again under mpirun with N processes (N must equal tp) and does
// not return; tp > 1 outside mpirun without it is refused. Each error names
// `key` (PREFIX.tp). Returns whether this process runs under mpirun.
bool launch_tensor_parallel(const std::string& command, const std::string& key, int64_t tp,
                            int nproc, const std::vector<std::string>& args);

// Under mpirun: the world is one tensor-parallel group of tp ranks (refused
// naming `key` otherwise); ranks other than 0 log warnings only and show no
// progress; the host's cores are shared among its ranks.
struct TensorParallelRanks {
  TensorParallelRanks(dist::MpiRuntime& mpi, const std::string& key, int64_t tp, double timeout_s);
  dist::Mesh mesh;
  dist::ProcessGroups groups;
  dist::Communicator& group() { return groups.get("tp"); }
  nn::TensorParallel tp() { return nn::TensorParallel{&group(), false}; }
  bool lead() const { return mesh.rank() == 0; }
};

}  // namespace nk
