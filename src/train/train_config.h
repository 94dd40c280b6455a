// The `nekton train` recipe: every key with its default and one-line doc.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/config_bind.h"
#include "data/data_config.h"
#include "dist/parallel_config.h"
#include "model/model_config.h"
#include "model/transformer.h"
#include "parallel/ddp_config.h"
#include "train/adamw.h"
#include "train/lr_schedule.h"

namespace nk {

// peft.*: parameter-efficient fine-tuning. LoRA, QLoRA, IA3, bottleneck
// adapters and p-tuning set model.lora, .ia3, .bottleneck or .prompt and
// freeze every base weight; QLoRA is LoRA over a base held in NF4.
struct PeftConfig {
  std::string method = "none";  // none | lora | qlora | ia3 | adapter | p_tuning
  LoraConfig lora{.rank = 8, .alpha = 16, .dropout = 0, .rslora = false, .target_modules = {}};
  std::string target_modules, feedforward_modules;  // as given: comma-separated
  int64_t adapter_dim = 32;                         // bottleneck adapters' width (NeMo's default)
  int64_t num_virtual_tokens = 20;                  // p-tuning
  int64_t encoder_hidden_size = 0;  // p-tuning's prompt encoder; 0: the model's width
  bool adapters() const { return method != "none"; }
  bool lora_kind() const { return method == "lora" || method == "qlora"; }
};

// train.eval_*: benchmark tasks (nekton eval tasks' definitions) run on the
// live model during training, logged as eval/TASK/METRIC.
struct TrainEvalTasks {
  std::string tasks;      // comma-separated tasks, groups or tags ("": none)
  int64_t every = 0;      // every N steps and at the last (0: the last only)
  std::string data;       // the tasks' documents (eval.data)
  std::string task_dir;   // "": the built-in configs/eval_tasks
  std::string tokenizer;  // "": data.tokenizer (bytes when that is empty)
  int64_t limit = 0, num_fewshot = -1, batch_size = 8;
};

struct TrainConfig {
  ModelConfig model;
  DataConfig data;
  PeftConfig peft;
  DType dtype = DType::BF16;
  Device device = kHost;  // train.device: where the model, its state and activations live
  int64_t micro_batch = 8, seq_len = 256, global_batch = 8;
  int64_t steps = 100;
  LrSchedule lr{.lr = 6e-4, .min_lr = 6e-5, .warmup_steps = 10, .decay_steps = 0};  // 0: steps
  AdamWConfig adamw;
  double grad_clip = 1.0;
  std::string recompute = "none";   // train.recompute: none | selective | full (Recompute)
  int64_t recompute_layers = 0;     // the first N layers recompute (0: all)
  std::string freeze;               // train.freeze as given: glob patterns over parameter names
  std::vector<std::string> frozen;  // the parameter names it matches, in layout order
  // How the frozen base is held: NF4 for QLoRA; under other adapters in
  // bf16, its bf16 copy alone; else an f32 master as for every weight. A base
  // without masters is not in checkpoints: a resumed run reads
  // train.init_from again (or draws the same random base from the seed).
  FrozenWeights frozen_weights = FrozenWeights::Master;
  uint64_t seed = 1234;
  int64_t threads = 0;
  int64_t val_every = 50, val_batches = 4, log_every = 1;
  TrainEvalTasks eval;
  std::string out_dir = "runs/train";
  std::string init_from;    // a model folder to start from (fine-tuning): its config and weights
  std::string resume_from;  // a previous run's OUT_DIR, a checkpoint folder or a model/ folder
  std::string resume = "auto";   // auto: continue from OUT_DIR/checkpoints; never: refuse them
  int64_t exit_at_step = 0;      // stop after this step and save (0 = run to `steps`)
  int64_t save_every = 0;        // checkpoint every N steps (0 = only at the end)
  bool save_final = true;        // the checkpoint and OUT_DIR/model after the last step
  int64_t keep_checkpoints = 3;  // newest checkpoints kept under OUT_DIR/checkpoints
  std::string metrics_file;      // default: out_dir/metrics.jsonl
  bool tensorboard = true;       // TensorBoard event file beside metrics_file
  double peak_tflops = 0;        // 0: measure the GEMM peak at start
  bool profile = false;          // time every CPU kernel; a table per step at the end
  std::string config_yaml;       // the resolved config, saved in every checkpoint
  // Settings of a command above train (align.*) that decide the samples or
  // the loss, by key: part of the data signature a resume checks.
  std::map<std::string, std::string> extra_data_signature;
  // parallel.*: the process layout (dist) and data parallelism's buckets.
  dist::ParallelConfig parallel;
  parallel::DdpConfig ddp;

  // Every key (model.*, data.*, train.*), in the order of the saved config.
  void bind(ConfigBinder& b);
  int64_t grad_accum() const { return global_batch / micro_batch; }
  bool indexed_data() const { return data.indexed(); }
  std::string checkpoint_root() const { return out_dir + "/checkpoints"; }
  // The run folder a resume reads: train.resume_from's (the OUT_DIR it
  // names, or the one holding the checkpoint folder it names), else
  // out_dir. Objectives read their own state beside the checkpoint there
  // (online RL's round files, PPO's critic).
  std::string resumed_run_dir() const;
};

ConfigSchema train_schema();
// Checks every value (nk::Error naming the key) and resolves defaults.
// needs_data false: a recipe may name no training data (nekton estimate).
TrainConfig train_config_from(const Config& cfg, bool needs_data = true);

}  // namespace nk
