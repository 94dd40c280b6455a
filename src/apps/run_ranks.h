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

struct RunRanks {
  // Sets cfg.threads where it is 0 and several ranks share the host.
  RunRanks(TrainConfig& cfg, dist::MpiRuntime& mpi);
  dist::Mesh mesh;
  dist::ProcessGroups groups;
  TrainParallel parallel() { return TrainParallel{&mesh, &groups}; }
};

}  // namespace nk
