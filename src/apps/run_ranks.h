// The processes of a training command under mpirun/srun (train, finetune,
// align): rank 0 logs the run, the mesh the layout asks for (refused before
// any work: a world size or batch it cannot use), this host's cores shared
// among its ranks (train.threads = 0), and the process groups.
#pragma once
#include "dist/mesh.h"
#include "dist/mpi/runtime.h"
#include "dist/process_groups.h"
#include "train/train_config.h"
#include "train/train_parallel.h"

namespace nk {

// Every multi-process command's: ranks other than 0 log warnings only and
// show no load progress (rank 0 speaks for the job).
void quiet_unless_rank0(int rank);
// Threads for each of this host's ranks, its cores shared among them; 0
// when this host runs one rank.
int threads_per_local_rank();

struct RunRanks {
  // Sets cfg.threads where it is 0 and several ranks share the host.
  RunRanks(TrainConfig& cfg, dist::MpiRuntime& mpi);
  dist::Mesh mesh;
  dist::ProcessGroups groups;
  TrainParallel parallel() { return TrainParallel{&mesh, &groups}; }
};

}  // namespace nk
