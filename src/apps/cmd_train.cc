#include <fmt/format.h>

#include "apps/commands.h"
#include "train/trainer.h"

namespace nk {

int cmd_train(const CommandArgs& a) {
  ConfigSchema schema = train_schema();
  if (a.help) {
    fmt::print("usage: nekton train [--config FILE.yaml] [key=value ...]\n\n{}", schema.help());
    return 0;
  }
  TrainConfig cfg = train_config_from(Config::load(schema, a.config_path, a.overrides));
  Trainer trainer(cfg);
  // Stopped by SIGTERM/SIGINT after saving a checkpoint is a clean exit (0), so
  // schedulers do not count a preempted job as failed; a rerun resumes.
  trainer.run();
  return 0;
}

}  // namespace nk
