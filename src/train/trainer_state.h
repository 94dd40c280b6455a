// What a stopped run needs, beyond its weights and optimizer moments, to
// continue exactly: the step reached, the training samples consumed, the
// optimizer's update count (AdamW bias correction), the LR schedule and its
// position, every random stream's seed and counter, plus the settings that
// decide which sample is number i (a resume under other settings would read
// other samples). Kept as trainer_state.json in each checkpoint and beside the
// exported model.
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
  int64_t optimizer_steps = 0;  // AdamW updates applied (its bias-correction count)
  LrSchedule lr;                // the schedule the run used; the next step's rate is lr.at(step)
  double last_lr = 0;           // the rate of the last update (for the record)
  // Every random stream of the run by name: its seed and its position (draws or
  // samples used). See rng_streams().
  std::map<std::string, uint64_t> rng;
};

// The random streams of a training run at a given state: "init.seed" (weight
// init, used once), "data.train.seed" + "data.train.position" (samples are a
// pure function of (seed, index), so the position is consumed_samples),
// "data.valid.seed" (validation re-reads the same samples each time). No other
// randomness (dropout, sampling) runs during training today; a stateful stream
// added later records its Rng::state() here.
std::map<std::string, uint64_t> rng_streams(const TrainConfig& cfg, int64_t consumed_samples);

// The settings that define the training sample order, as text by config key
// (plus "num_samples", the size the indices were built for).
std::map<std::string, std::string> data_signature(const TrainConfig& cfg);

std::string trainer_state_path(const std::string& model_dir);  // MODEL_DIR/trainer_state.json
void save_trainer_state(const std::string& path, const TrainerState& s);  // atomic
// nk::Error naming the file for a missing file, bad JSON or a missing field.
TrainerState load_trainer_state(const std::string& path);
std::string trainer_state_to_json(const TrainerState& s);
// Reads version 1 (step and data only) and 2; nk::Error naming `where`.
TrainerState trainer_state_from_json(const std::string& text, const std::string& where);

// nk::Error naming the first key whose saved value differs from `cfg`'s (the
// resumed run would read other samples); only a different num_samples (from
// train.steps) is a warning, since extending a run is a common wish.
void check_resume_data(const TrainerState& saved, const TrainConfig& cfg, const std::string& where);

}  // namespace nk
