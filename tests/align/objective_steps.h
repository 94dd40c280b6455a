// The steps every objective parity test runs (preference_parity_test.cc,
// reward_parity_test.cc): 5 AdamW steps of a TrainObjective on one
// micro-batch, with clipping, written where the float64 PyTorch references
// read them: DIR/optim.json (the optimizer's settings) and
// DIR/nekton.safetensors (each step's loss, every final weight).
#pragma once
#include <array>
#include <cmath>
#include <filesystem>
#include <memory>
#include <vector>

#include "align/preference_data.h"
#include "ckpt/safetensors.h"
#include "core/atomic_file.h"
#include "core/rng.h"
#include "model/parity_steps.h"
#include "tensor_util.h"
#include "train/adamw.h"
#include "train/train_config.h"
#include "train/train_objective.h"

namespace nk::test {

// `pairs` examples of random tokens over `vocab` from `seed`: example e's
// prompt of lens[e][0] tokens, then its two completions of lens[e][1] and
// lens[e][2] tokens (the loss on those), as read_preference_jsonl lays
// them out (sequences 2e, 2e + 1), lines 1, 2, ...
inline std::shared_ptr<PreferenceData> random_preference_data(
    int64_t vocab, const std::vector<std::array<int64_t, 3>>& lens, uint64_t seed) {
  auto d = std::make_shared<PreferenceData>();
  d->path = "random";
  Rng rng(seed);
  for (size_t e = 0; e < lens.size(); ++e) {
    std::vector<int32_t> prompt;
    for (int64_t k = 0; k < lens[e][0]; ++k) prompt.push_back(int32_t(rng.below(uint64_t(vocab))));
    for (int side = 0; side < 2; ++side) {
      std::vector<int32_t> t = prompt;
      std::vector<uint8_t> m(prompt.size(), 0);
      for (int64_t k = 0; k < lens[e][size_t(1 + side)]; ++k) {
        t.push_back(int32_t(rng.below(uint64_t(vocab))));
        m.push_back(1);
      }
      d->tokens.push_back(t);
      d->trained.push_back(m);
    }
    d->line.push_back(int64_t(e) + 1);
  }
  return d;
}

// A fresh DIR and the one-process f32 recipe the parity tests train: one
// micro-batch of B rows of T tokens per step, seed 42, OUT_DIR = DIR/run
// (created).
inline TrainConfig parity_train_config(const ModelConfig& mc, int64_t B, int64_t T,
                                       const std::filesystem::path& dir) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  TrainConfig cfg;
  cfg.model = mc;
  cfg.dtype = DType::F32;
  cfg.seq_len = T;
  cfg.micro_batch = cfg.global_batch = B;
  cfg.seed = 42;
  cfg.out_dir = (dir / "run").string();
  std::filesystem::create_directories(cfg.out_dir);
  return cfg;
}

// The steps' settings: ParitySteps' with AdamW's eps at 1e-3 (below).
inline ParitySteps objective_parity_steps() {
  ParitySteps ps;
  ps.adamw.eps = 1e-3;
  return ps;
}

// `critic`: an objective's own model (PPO's), updated by the objective
// (own_step) and clipped with the model; its final weights are written as
// weight.critic.NAME, and the rate it steps at relative to the model's as
// optim.json's critic_lr_scale.
inline void run_objective_steps(TrainObjective& obj, Transformer& model, const Tensor& tokens,
                                const Tensor& targets, const std::filesystem::path& dir,
                                Transformer* critic = nullptr, double critic_lr_scale = 1.0) {
  Activations acts(model, tokens.dim(0), tokens.dim(1), true);
  // AdamW divides each gradient by its own running size, so a weight whose
  // gradient is tiny (0 in exact arithmetic, as GPT-2's key biases: softmax
  // ignores a shift of every score) takes a step set by f32 rounding noise:
  // +-lr / 2 with eps = 1e-8. The weights would then compare noise. With
  // eps = 1e-3 a gradient's rounding error moves a weight by at most
  // lr x error / eps, and the comparison checks the gradients themselves
  // (they reach 6e-3 here, so the larger ones still take Adam's steps).
  const ParitySteps ps = objective_parity_steps();
  AdamW opt(model, ps.adamw);
  std::vector<float> losses;
  for (int64_t s = 0; s < ps.steps; ++s) {
    model.zero_grads();
    losses.push_back(float(
        obj.train_micro_batch(model, acts, MicroBatch{tokens, targets, tokens, targets}, 1.f)));
    const double norm = std::sqrt(ops::sum_squares(model.grads()) + obj.own_grad_norm_squared());
    const float clip = norm > ps.clip ? float(ps.clip / norm) : 1.f;
    opt.step(ps.lr, clip);
    obj.own_step(ps.lr, clip);
  }
  write_file_atomic((dir / "optim.json").string(),
                    fmt::format(R"({{"lr": {}, "beta1": {}, "beta2": {}, "eps": {},
 "weight_decay": {}, "grad_clip": {}, "steps": {}, "critic_lr_scale": {}}})",
                                ps.lr, ps.adamw.beta1, ps.adamw.beta2, ps.adamw.eps,
                                ps.adamw.weight_decay, ps.clip, ps.steps, critic_lr_scale));
  std::vector<std::pair<std::string, Tensor>> out = {{"step_losses", f32_tensor(losses)}};
  auto add_weights = [&](Transformer& m, const std::string& prefix) {
    for (const ParamInfo& p : m.layout().params()) {
      Tensor w = Tensor::empty(p.shape, DType::F32);
      ops::convert(w, ParamLayout::view(m.params(), p));
      out.emplace_back(prefix + p.name, w);
    }
  };
  add_weights(model, "weight.");
  if (critic) add_weights(*critic, "weight.critic.");
  save_safetensors((dir / "nekton.safetensors").string(), out);
}

}  // namespace nk::test
