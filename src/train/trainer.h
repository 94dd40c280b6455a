// The single-process training loop: micro-batches with gradient accumulation,
// global-norm clipping, AdamW with warmup + cosine decay, periodic validation,
// a log line and a JSONL record per step, the final model saved as safetensors.
#pragma once
#include <functional>
#include <memory>

#include "data/text_dataset.h"
#include "train/train_config.h"

namespace nk {

struct StepStats {
  int64_t step = 0;  // 1-based
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, mfu = 0, step_ms = 0;
  double val_loss = NAN;  // set on validation steps
  size_t peak_bytes = 0;  // Nekton tensors' peak
};

class Trainer {
 public:
  // Loads the corpus and builds the model; nothing is written yet.
  explicit Trainer(const TrainConfig& cfg);
  ~Trainer();
  // Runs all steps; `on_step` (optional) sees every step's figures. Writes
  // OUT_DIR/metrics.jsonl as it goes and OUT_DIR/model at the end. A non-finite
  // loss or gradient stops with nk::Error naming the step.
  void run(const std::function<void(const StepStats&)>& on_step = {});
  Transformer& model() { return *model_; }
  const std::vector<StepStats>& history() const { return history_; }
  double evaluate();  // mean validation loss over val_batches micro-batches

 private:
  TrainConfig cfg_;
  TextCorpus corpus_;
  std::unique_ptr<Transformer> model_;
  std::vector<StepStats> history_;
};

// Measured peak of the compute dtype's matrix product (FLOP/s), for MFU.
double measure_gemm_peak(DType dtype);

}  // namespace nk
