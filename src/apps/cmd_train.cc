#include <fmt/format.h>

#include <thread>

#include "apps/commands.h"
#include "apps/mpirun_launch.h"
#include "core/log.h"
#include "dist/mpi/launch_env.h"
#include "dist/mpi/runtime.h"
#include "train/trainer.h"

namespace nk {

namespace {
// Under mpirun/srun: the mesh, the process groups and a data-parallel Trainer.
// Every rank's error reaches the user as "nekton rank R: ..." and ends the
// whole job (the other ranks would otherwise wait for it until the timeout).
int train_under_mpi(TrainConfig cfg, int* argc, char*** argv) {
  dist::MpiRuntime mpi(argc, argv);
  try {
    if (mpi.rank() != 0) set_log_level(LogLevel::Warn);  // rank 0 logs the run
    // Refused before any work: a world size or batch the layout cannot use.
    dist::Mesh mesh = train_mesh(cfg, mpi.world_size(), mpi.rank());
    if (cfg.threads == 0 && dist::local_world_size() > 1)  // share this host's cores
      cfg.threads =
          std::max(1, int(std::thread::hardware_concurrency()) / dist::local_world_size());
    dist::ProcessGroups groups = mpi.make_groups(mesh, cfg.parallel.timeout_s);
    Trainer trainer(cfg, TrainParallel{&mesh, &groups});
    trainer.run();
  } catch (const std::exception& e) {
    mpi.abort(e.what());
  }
  return 0;
}
}  // namespace

int cmd_train(const CommandArgs& a) {
  ConfigSchema schema = train_schema();
  if (a.help) {
    fmt::print("usage: nekton train [--nproc N] [--config FILE.yaml] [key=value ...]\n\n{}",
               schema.help());
    fmt::print(
        "\nData parallel: nekton train --nproc N ... (one host), or mpirun -np N nekton train\n"
        "... (or srun); every rank reads its share of train.global_batch, which must be a\n"
        "multiple of N x train.micro_batch.\n");
    return 0;
  }
  TrainConfig cfg = train_config_from(Config::load(schema, a.config_path, a.overrides));
  if (a.nproc > 0 && !dist::launched_by_mpi()) {
    // Checked here first, so a layout that cannot work fails before mpirun starts.
    train_mesh(cfg, a.nproc, 0);
    std::vector<std::string> args = {"train"};
    if (!a.config_path.empty()) args.insert(args.end(), {"--config", a.config_path});
    args.insert(args.end(), a.overrides.begin(), a.overrides.end());
    exec_mpirun(a.nproc, args);
  }
  if (dist::launched_by_mpi()) return train_under_mpi(cfg, nullptr, nullptr);
  Trainer trainer(cfg);
  // Stopped by SIGTERM/SIGINT after saving a checkpoint is a clean exit (0), so
  // schedulers do not count a preempted job as failed; a rerun resumes.
  trainer.run();
  return 0;
}

}  // namespace nk
