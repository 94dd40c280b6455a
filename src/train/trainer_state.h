// What a stopped run needs, beyond its model weights, to continue exactly:
// the step reached and the training samples consumed, plus the settings that
// decide which sample is number i (a resume under other settings would read
// other samples). Kept as MODEL_DIR/trainer_state.json. Optimizer moments and
// RNG states will join this struct when full checkpoints arrive.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "train/train_config.h"

namespace nk {

struct TrainerState {
  int64_t step = 0;              // optimizer steps completed
  int64_t consumed_samples = 0;  // training samples read by those steps
  // "data.prefix" -> "...", "train.seq_len" -> "256", ...: see data_signature().
  std::map<std::string, std::string> data;
};

// The settings that define the training sample order, as text by config key
// (plus "num_samples", the size the indices were built for).
std::map<std::string, std::string> data_signature(const TrainConfig& cfg);

std::string trainer_state_path(const std::string& model_dir);  // MODEL_DIR/trainer_state.json
void save_trainer_state(const std::string& path, const TrainerState& s);  // atomic
// nk::Error naming the file for a missing file, bad JSON or a missing field.
TrainerState load_trainer_state(const std::string& path);

// nk::Error naming the first key whose saved value differs from `cfg`'s (the
// resumed run would read other samples); only a different num_samples (from
// train.steps) is a warning, since extending a run is a common wish.
void check_resume_data(const TrainerState& saved, const TrainConfig& cfg, const std::string& where);

}  // namespace nk
