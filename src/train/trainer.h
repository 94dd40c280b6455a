// The single-process training loop: micro-batches with gradient accumulation,
// global-norm clipping, AdamW with warmup + cosine decay, periodic validation,
// a log line and a JSONL record per step, the final model saved as safetensors
// with the trainer state beside it (train.resume_from continues from there).
#pragma once
#include <functional>
#include <memory>

#include "data/data_loader.h"
#include "train/train_config.h"
#include "train/train_data.h"
#include "train/trainer_state.h"

namespace nk {

struct StepStats {
  int64_t step = 0;  // 1-based
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, mfu = 0, step_ms = 0;
  double val_loss = NAN;  // set on validation steps
  size_t peak_bytes = 0;  // Nekton tensors' peak
};

class Trainer {
 public:
  // Loads the data (building or loading its indices) and builds the model, or
  // with train.resume_from loads the saved model and trainer state (nk::Error
  // if their data settings or model config differ); nothing is written yet.
  explicit Trainer(const TrainConfig& cfg);
  ~Trainer();
  // Runs the steps from state().step to train.steps (or train.exit_at_step);
  // `on_step` (optional) sees every step's figures. Writes OUT_DIR/metrics.jsonl
  // as it goes (appending when resumed) and, at the end, OUT_DIR/model and
  // OUT_DIR/model/trainer_state.json. A non-finite loss or gradient stops with
  // nk::Error naming the step.
  void run(const std::function<void(const StepStats&)>& on_step = {});
  // Sees every training micro-batch before its forward pass (step is 1-based).
  using BatchObserver =
      std::function<void(int64_t step, const Tensor& inputs, const Tensor& targets)>;
  void set_batch_observer(BatchObserver f) { on_batch_ = std::move(f); }
  const TrainerState& state() const { return state_; }
  Transformer& model() { return *model_; }
  const std::vector<StepStats>& history() const { return history_; }
  double evaluate();  // mean validation loss over val_batches micro-batches

 private:
  void resume();  // loads the model and state named by train.resume_from
  TrainConfig cfg_;
  TrainData data_;
  TrainerState state_;
  BatchObserver on_batch_;
  std::unique_ptr<Transformer> model_;
  std::vector<StepStats> history_;
};

// Measured peak of the compute dtype's matrix product (FLOP/s), for MFU.
double measure_gemm_peak(DType dtype);

}  // namespace nk
