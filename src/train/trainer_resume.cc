// The Trainer's start from saved state: a Hugging Face base imported for
// train.init_from, and resume from a full checkpoint (any layout) or, for runs
// from before full checkpoints, from an exported model folder.
#include <filesystem>

#include "ckpt/checkpoint.h"
#include "ckpt/hf_io.h"
#include "core/log.h"
#include "train/train_checkpoint.h"
#include "train/trainer.h"

namespace nk {

void Trainer::import_hf_base() {
  if (cfg_.init_from.empty() || !is_hf_model_folder(cfg_.init_from)) return;
  const std::string base = imported_base_dir(cfg_);
  if (par_.writes() && !std::filesystem::exists(base + "/config.json")) {
    // A base held in bf16 alone (or NF4) needs no more than bf16 on disk.
    HfImportOptions o;
    o.storage = cfg_.dtype == DType::BF16 && cfg_.frozen_weights != FrozenWeights::Master
                    ? DType::BF16
                    : DType::F32;
    const HfImportReport r = import_hf(cfg_.init_from, base, o);
    NK_INFO(
        "train.init_from: imported the Hugging Face model {} ({}, {:.2f}M parameters, {}) into {}",
        cfg_.init_from, r.architecture, double(r.n_params) / 1e6, dtype_name(o.storage), base);
  }
  if (par_.active()) par_.groups->get("world").barrier();
}

void Trainer::resume() {
  namespace fs = std::filesystem;
  const std::string own_root = cfg_.checkpoint_root();
  const bool own_has = !list_checkpoints(own_root).empty();
  if (cfg_.resume_from.empty()) {
    if (!own_has) return;
    if (cfg_.resume == "never")
      fail(
          "train.resume=never: train.out_dir already holds checkpoints in '{}'; choose another "
          "train.out_dir, remove that folder, or set train.resume=auto to continue from it",
          own_root);
    // Rank 0 repairs what a killed save left; the others then find the same
    // newest checkpoint (never two processes removing each other's files).
    std::string dir;
    if (par_.writes()) dir = recover_checkpoint_root(own_root);
    if (par_.active()) par_.groups->get("world").barrier();
    if (!par_.writes()) dir = find_latest_checkpoint(own_root);
    resume_checkpoint(dir);
    saved_step_ = state_.step;
    return;
  }
  // train.resume_from: a checkpoint folder, a run's OUT_DIR with checkpoints,
  // or (runs from before full checkpoints) an OUT_DIR or model/ folder.
  const fs::path from(cfg_.resume_from);
  std::string dir;
  if (fs::exists(from / "manifest.json") || checkpoint_step(from.string()) >= 0) {
    dir = from.string();
    CheckpointReader::open(dir);  // an explicit folder must verify: no fallback
  } else if (!list_checkpoints((from / "checkpoints").string()).empty()) {
    dir = find_latest_checkpoint((from / "checkpoints").string());
  }
  std::error_code ec;
  bool same_root = !dir.empty() && fs::equivalent(fs::path(dir).parent_path(), own_root, ec) && !ec;
  if (own_has && !same_root)
    fail(
        "train.resume_from: train.out_dir already holds checkpoints of another run in '{}'; "
        "resuming '{}' into it would mix two runs: choose a fresh train.out_dir",
        own_root, cfg_.resume_from);
  if (dir.empty()) return resume_legacy();
  resume_checkpoint(dir);
  if (same_root) saved_step_ = state_.step;
}

void Trainer::resume_checkpoint(const std::string& dir) {
  LoadedTrainCheckpoint c = load_train_checkpoint(dir, cfg_, tensor_parallel(), pipeline_stage());
  const TrainerState& saved = c.state;
  check_resume_data(saved, cfg_, "checkpoint '" + dir + "'");
  if (saved.step > cfg_.steps)
    fail("checkpoint '{}' is at step {}, beyond train.steps = {}", dir, saved.step, cfg_.steps);
  for (const auto& [name, value] : rng_streams(cfg_, saved.consumed_samples)) {
    auto it = saved.rng.find(name);
    if (it == saved.rng.end() || it->second != value)
      fail("checkpoint '{}': random stream {} is {} there but {} here", dir, name,
           it == saved.rng.end() ? std::string("missing") : std::to_string(it->second), value);
  }
  const LrSchedule &a = saved.lr, &b = cfg_.lr;
  if (a.lr != b.lr || a.min_lr != b.min_lr || a.warmup_steps != b.warmup_steps ||
      a.decay_steps != b.decay_steps)
    NK_WARN(
        "checkpoint '{}': the LR schedule changed (lr {} -> {}, min_lr {} -> {}, warmup {} -> "
        "{}, decay_steps {} -> {}); the run continues on the new one",
        dir, a.lr, b.lr, a.min_lr, b.min_lr, a.warmup_steps, b.warmup_steps, a.decay_steps,
        b.decay_steps);
  // Everything read and checked: swap it in (the moments once the optimizer
  // exists, which under parallel.shard=optimizer needs the data-parallel plan).
  model_ = std::move(c.model);
  opt_.reset();
  state_.step = saved.step;
  state_.consumed_samples = saved.consumed_samples;
  state_.optimizer_steps = saved.optimizer_steps;
  state_.last_lr = saved.last_lr;
  state_.rng = rng_streams(cfg_, saved.consumed_samples);
  NK_INFO("resuming from checkpoint {} at step {} ({} samples consumed)", dir, state_.step,
          state_.consumed_samples);
  resumed_ = std::move(c);
}

void Trainer::resume_legacy() {
  // train.resume_from names a run's OUT_DIR, or its model folder directly.
  namespace fs = std::filesystem;
  std::string model_dir = cfg_.resume_from;
  if (!fs::exists(trainer_state_path(model_dir)) && fs::exists(fs::path(model_dir) / "model"))
    model_dir = (fs::path(model_dir) / "model").string();
  std::string state_path = trainer_state_path(model_dir);
  if (!fs::exists(state_path))
    fail("train.resume_from: no trainer state in '{}' (expected {} or a checkpoints/ folder)",
         cfg_.resume_from, state_path);
  TrainerState saved = load_trainer_state(state_path);
  check_resume_data(saved, cfg_, "train.resume_from '" + state_path + "'");
  if (saved.step > cfg_.steps)
    fail("train.resume_from: the saved run is at step {}, beyond train.steps = {}", saved.step,
         cfg_.steps);
  if (model_parallel())
    fail(
        "train.resume_from: '{}' is an exported model, not a checkpoint; resuming it under "
        "parallel.tp or parallel.pp > 1 is not supported (resume a checkpoint folder)",
        cfg_.resume_from);
  model_ = load_run_model(cfg_, model_dir, "train.resume_from");
  state_.step = saved.step;
  state_.consumed_samples = saved.consumed_samples;
  state_.rng = rng_streams(cfg_, saved.consumed_samples);
  NK_WARN(
      "resuming from the exported model {} at step {} ({} samples consumed): it holds no "
      "optimizer state, so AdamW starts from zero moments and the run will not match an "
      "uninterrupted one",
      model_dir, state_.step, state_.consumed_samples);
}

}  // namespace nk
