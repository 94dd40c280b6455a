#include "apps/run_ranks.h"

#include <algorithm>
#include <thread>

#include "ckpt/load_progress.h"
#include "core/log.h"
#include "dist/mpi/launch_env.h"

namespace nk {

namespace {

dist::Mesh join(TrainConfig& cfg, dist::MpiRuntime& mpi) {
  if (mpi.rank() != 0) {  // rank 0 logs the run and shows its loads' progress
    set_log_level(LogLevel::Warn);
    set_load_progress_mode(ProgressMode::None);
  }
  dist::Mesh mesh = train_mesh(cfg, mpi.world_size(), mpi.rank());
  if (cfg.threads == 0 && dist::local_world_size() > 1)  // share this host's cores
    cfg.threads = std::max(1, int(std::thread::hardware_concurrency()) / dist::local_world_size());
  return mesh;
}

}  // namespace

RunRanks::RunRanks(TrainConfig& cfg, dist::MpiRuntime& mpi)
    : mesh(join(cfg, mpi)), groups(mpi.make_groups(mesh, cfg.parallel.timeout_s)) {}

}  // namespace nk
