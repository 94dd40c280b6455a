#include "apps/run_ranks.h"

#include <algorithm>
#include <thread>

#include "ckpt/load_progress.h"
#include "core/log.h"
#include "dist/mpi/launch_env.h"

namespace nk {

namespace {

dist::Mesh join(TrainConfig& cfg, dist::MpiRuntime& mpi) {
  quiet_unless_rank0(mpi.rank());
  dist::Mesh mesh = train_mesh(cfg, mpi.world_size(), mpi.rank());
  if (cfg.threads == 0) cfg.threads = threads_per_local_rank();
  return mesh;
}

}  // namespace

void quiet_unless_rank0(int rank) {
  if (rank == 0) return;
  set_log_level(LogLevel::Warn);
  set_load_progress_mode(ProgressMode::None);
}

int threads_per_local_rank() {
  const int local = dist::local_world_size();
  return local > 1 ? std::max(1, int(std::thread::hardware_concurrency()) / local) : 0;
}

RunRanks::RunRanks(TrainConfig& cfg, dist::MpiRuntime& mpi)
    : mesh(join(cfg, mpi)), groups(mpi.make_groups(mesh, cfg.parallel.timeout_s)) {}

}  // namespace nk
