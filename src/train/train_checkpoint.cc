#include "train/train_checkpoint.h"

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "ckpt/model_io.h"
#include "core/error.h"
#include "train/freeze.h"

namespace nk {

namespace {
constexpr const char* kExpAvg = "exp_avg.";
constexpr const char* kExpAvgSq = "exp_avg_sq.";
constexpr const char* kFrozen = "frozen";  // optimizer metadata; absent when nothing is frozen

// The trainable parameters alone: the layout of the optimizer state. Their
// offsets are those of the full layout, which puts them first.
ParamLayout trainable_layout(const ParamLayout& full) {
  ParamLayout t;
  for (const ParamInfo& p : full.params())
    if (p.trainable) t.add(p.name, p.shape, p.init, p.init_std, param_options(p));
  t.finalize();
  NK_CHECK(t.total() == full.trainable_end(), "trainable layout: {} elements, expected {}",
           t.total(), full.trainable_end());
  for (const ParamInfo& p : t.params())
    NK_CHECK(p.offset == full.find(p.name).offset, "trainable layout: '{}' moved", p.name);
  return t;
}
}  // namespace

std::string save_train_checkpoint(const TrainConfig& cfg, Transformer& model, AdamW& opt,
                                  const TrainerState& state) {
  NK_CHECK(opt.steps_done() == state.optimizer_steps,
           "save_train_checkpoint: optimizer at update {}, state says {}", opt.steps_done(),
           state.optimizer_steps);
  const ParamLayout& layout = model.layout();
  NK_CHECK(opt.state_mirrors_arenas() && opt.state_size() == layout.trainable_end(),
           "save_train_checkpoint: the optimizer state ({} elements) is not laid out like the "
           "model's {} trainable elements",
           opt.state_size(), layout.trainable_end());
  const ParamLayout trainable = trainable_layout(layout);
  CheckpointContents c;
  c.step = state.step;
  c.model = flat_tensors(layout, model.params(), "");
  c.optimizer = flat_tensors(trainable, opt.m(), kExpAvg);
  for (auto& t : flat_tensors(trainable, opt.v(), kExpAvgSq)) c.optimizer.push_back(std::move(t));
  describe_flat_tensors(c, layout, "");
  for (const char* prefix : {kExpAvg, kExpAvgSq}) describe_flat_tensors(c, trainable, prefix);
  c.optimizer_metadata = {{"optimizer", "adamw"},
                          {"optimizer_steps", std::to_string(opt.steps_done())}};
  if (const std::string frozen = frozen_list(layout); !frozen.empty())
    c.optimizer_metadata[kFrozen] = frozen;
  c.text_files["trainer_state.json"] = trainer_state_to_json(state);
  c.text_files["config.yaml"] = cfg.config_yaml;
  c.text_files["config.json"] = model_config_to_json(model.config());
  return save_checkpoint(cfg.checkpoint_root(), c, cfg.keep_checkpoints);
}

LoadedTrainCheckpoint load_train_checkpoint(const std::string& dir, const TrainConfig& cfg) {
  CheckpointReader r = CheckpointReader::open(dir);
  LoadedTrainCheckpoint out;
  out.dir = dir;
  out.state = trainer_state_from_json(r.text("trainer_state.json"), r.path("trainer_state.json"));
  if (out.state.step != r.step())
    fail("checkpoint '{}': trainer_state.json is at step {}, the manifest at step {}", dir,
         out.state.step, r.step());

  // Fresh buffers; the caller swaps them in only once all of them are read.
  out.model =
      std::make_unique<Transformer>(cfg.model, cfg.dtype, cfg.seed, ParamInit::Zeros, cfg.frozen);
  const ParamLayout& layout = out.model->layout();
  SafetensorsFile weights = r.model();
  read_flat_tensors(weights, layout, "", out.model->params());
  SafetensorsFile opt = r.optimizer();
  auto meta = opt.metadata();
  if (meta["optimizer"] != "adamw")
    fail("{}: holds optimizer '{}', this run uses adamw", opt.path(), meta["optimizer"]);
  if (meta["optimizer_steps"] != std::to_string(out.state.optimizer_steps))
    fail("{}: optimizer_steps {} differs from trainer_state.json's {}", opt.path(),
         meta["optimizer_steps"], out.state.optimizer_steps);
  // Moments exist for the trainable parameters only: the same set must be frozen.
  const std::string saved_frozen = meta.count(kFrozen) ? meta[kFrozen] : "";
  if (saved_frozen != frozen_list(layout))
    fail(
        "train.freeze: checkpoint '{}' was trained with {} frozen, but this run freezes {}; a "
        "resumed run must freeze the same parameters",
        dir, saved_frozen.empty() ? "nothing" : saved_frozen,
        frozen_list(layout).empty() ? "nothing" : frozen_list(layout));
  const ParamLayout trainable = trainable_layout(layout);
  out.exp_avg = Tensor::zeros({trainable.total()}, DType::F32);
  out.exp_avg_sq = Tensor::zeros({trainable.total()}, DType::F32);
  read_flat_tensors(opt, trainable, kExpAvg, out.exp_avg);
  read_flat_tensors(opt, trainable, kExpAvgSq, out.exp_avg_sq);

  // Same shapes, but maybe another norm_eps, rope_theta, ...: refuse those too.
  nlohmann::json saved = nlohmann::json::parse(r.text("config.json"), nullptr, false);
  nlohmann::json now = nlohmann::json::parse(model_config_to_json(cfg.model));
  for (const auto& [key, value] : now.items())
    if (!saved.is_object() || !saved.contains(key) || saved[key] != value)
      fail("checkpoint '{}': model {} is {} in {} but {} here (model.* must match)", dir, key,
           saved.is_object() && saved.contains(key) ? saved[key].dump() : "missing",
           r.path("config.json"), value.dump());
  // Keys written only when set (rope_scaling, sliding_window): one the
  // checkpoint has and this run lacks is a difference too.
  if (saved.is_object())
    for (const auto& [key, value] : saved.items())
      if (!now.contains(key))
        fail("checkpoint '{}': model {} is {} in {} but not set here (model.* must match)", dir,
             key, value.dump(), r.path("config.json"));
  // The bf16 copy the kernels read, rounded exactly as AdamW's fused copy rounds.
  out.model->sync_compute_params();
  return out;
}

}  // namespace nk
