// The `nekton train` recipe: every key with its default and one-line doc.
#pragma once
#include <string>

#include "core/config.h"
#include "model/model_config.h"
#include "train/adamw.h"
#include "train/lr_schedule.h"

namespace nk {

struct TrainConfig {
  ModelConfig model;
  DType dtype = DType::BF16;
  std::string data_path;
  double val_fraction = 0.05;
  int64_t max_bytes = 0;
  bool replace_invalid_utf8 = false;
  int64_t micro_batch = 8, seq_len = 256, global_batch = 8;
  int64_t steps = 100;
  LrSchedule lr;
  AdamWConfig adamw;
  double grad_clip = 1.0;
  uint64_t seed = 1234;
  int64_t threads = 0;
  int64_t val_every = 50, val_batches = 4, log_every = 1;
  std::string out_dir = "runs/train";
  std::string metrics_file;  // default: out_dir/metrics.jsonl
  double peak_tflops = 0;    // 0: measure the GEMM peak at start

  int64_t grad_accum() const { return global_batch / micro_batch; }
};

ConfigSchema train_schema();
// Checks every value (nk::Error naming the key) and resolves defaults.
TrainConfig train_config_from(const Config& cfg);

}  // namespace nk
