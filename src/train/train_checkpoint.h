// The Trainer's side of ckpt/checkpoint.h: which tensors and files make up a
// full training state, and how it is rebuilt into fresh objects on load.
#pragma once
#include <memory>
#include <string>

#include "dist/communicator.h"
#include "train/adamw.h"
#include "train/train_config.h"
#include "train/trainer_state.h"

namespace nk {

// The model saved in DIR (train.init_from, or a run's model/ folder for
// train.resume_from, named by `key` in errors) in the run's layout (frozen
// parameters last), frozen-weight storage (cfg.frozen_weights) and device,
// read one tensor at a time; adapters the run adds and DIR's model lacks are
// initialised from the seed. nk::Error naming key and DIR when its config is
// not the run's model.*.
// A Hugging Face folder as DIR is read from its import, imported_base_dir(cfg).
// tp, stage: this rank's tensor-parallel shards of its pipeline stage's
// parameters alone (f32 masters; a run adding parameters is refused there).
std::unique_ptr<Transformer> load_run_model(const TrainConfig& cfg, const std::string& dir,
                                            const char* key, const nn::TensorParallel& tp = {},
                                            const PipelineStage& stage = {});
// Where a Hugging Face train.init_from is imported: OUT_DIR/base.
std::string imported_base_dir(const TrainConfig& cfg);

// Writes cfg.checkpoint_root()/step_N: master weights, AdamW moments (of the
// trainable parameters) and update count, the names of the frozen parameters, `state` (step,
// samples, LR position, RNG streams), the resolved config and the model config. Returns the folder.
// A base without f32 masters (cfg.frozen_weights not Master) is not saved: a resumed run reads
// train.init_from again (the same bytes give the same bf16 or NF4 weights), or draws the same
// random base from the seed.
std::string save_train_checkpoint(const TrainConfig& cfg, Transformer& model, AdamW& opt,
                                  const TrainerState& state);
// The same with the moments given (f32, laid out as model's trainable
// parameters) and the optimizer's update count: a tensor-parallel run's
// writer saves the whole model gathered from the ranks' shards.
std::string save_train_checkpoint(const TrainConfig& cfg, Transformer& model, const Tensor& m,
                                  const Tensor& v, int64_t optimizer_steps,
                                  const TrainerState& state);

// The same for a run whose optimizer state is sharded over `group` (ZeRO-1):
// every rank of the group calls it; each writes its own moments as
// optimizer.RRRRR-of-NNNNN.safetensors (with `shard_weights`: FSDP, or ZeRO-1
// with bf16 compute, also its blocks of the f32 master weights as
// model.RRRRR-of-NNNNN.safetensors, rank 0's
// holding the frozen parameters whole), rank 0 the weights and the small files,
// and rank 0 installs the folder only once every rank's file is durable
// (ckpt/checkpoint.h). load_train_checkpoint reads it under any layout.
std::string save_sharded_train_checkpoint(const TrainConfig& cfg, Transformer& model, AdamW& opt,
                                          const TrainerState& state, dist::Communicator& group,
                                          bool shard_weights = false);

// A checkpoint read into new buffers; nothing the caller holds is touched.
struct LoadedTrainCheckpoint {
  std::string dir;
  std::unique_ptr<Transformer> model;  // compute-dtype weights refreshed from the masters
  Tensor exp_avg, exp_avg_sq;          // f32 [layout trainable_end], whatever layout saved them
  TrainerState state;
};

// Verifies DIR (checksums) and loads it for a run configured by `cfg`:
// nk::Error naming the file for a missing or corrupt file, naming the tensor
// and both shapes for a checkpoint of another model, naming train.freeze for
// one that froze other parameters. tp, stage: the run's tensor-parallel
// group and pipeline stage; such a rank reads only its stage's parameters
// and of them its slices (of any checkpoint not saved in ZeRO/FSDP pieces),
// so a checkpoint of any tensor- or pipeline-parallel layout resumes under
// any other.
LoadedTrainCheckpoint load_train_checkpoint(const std::string& dir, const TrainConfig& cfg,
                                            const nn::TensorParallel& tp = {},
                                            const PipelineStage& stage = {});

}  // namespace nk
