// train.eval_tasks: `nekton eval tasks` during training. The tasks (and
// groups) are read when the hook is attached, so a bad definition stops the
// run before its first step; at each evaluation step they run on the live
// model in process (eval/task_suite.h over LocalEvalModel, in the training
// compute precision), and every task's and aggregating group's metrics
// become eval/NAME/METRIC figures of the step's log line and metrics record.
#pragma once
#include "train/trainer.h"

namespace nk {

// Nothing when train.eval_tasks is empty.
void attach_eval_tasks(Trainer& trainer, const TrainConfig& cfg);

}  // namespace nk
