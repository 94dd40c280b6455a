// PPO's critic as a model of its own (align.value_model), as TRL's
// PPOTrainer trains its value_model beside the policy: a one-label sequence
// classifier whose score head, read at every position, is the value of the
// state there (Transformer::token_scores_forward). Started from a reward
// model (TRL's recipe: the value model loaded from the reward model's path)
// or from a causal LM's trunk with a score head drawn from the seed.
// Trained with the policy's loss (its value term is the only one it
// reaches), its gradients clipped with the policy's under one global norm
// and updated by an AdamW of its own at the policy's rate (TRL: one
// optimizer over PolicyAndValueWrapper), so a run equals TRL's joint update.
// It is whole on every rank, under any layout of the policy: each rank's
// head adds the gradients of the rows it trains (ObjectiveRanks::own_grads:
// a replica's, a cp rank's positions of whole rows, once per tensor-parallel
// group, on a pipeline's last stage) and the sum over the ranks
// (ObjectiveRanks::sum_own_grads) steps every rank's copy alike. Its checkpoints are
// OUT_DIR/critic/checkpoints (written before the policy's of the same step), its final weights
// OUT_DIR/critic/model (a reward-model folder: `nekton eval reward` reads it).
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "model/transformer.h"
#include "train/adamw.h"
#include "train/train_config.h"

namespace nk {

class Critic {
 public:
  // The critic of a run configured by `run` (dtype, seed, adamw, out_dir,
  // keep_checkpoints, micro_batch, seq_len) from `dir` (align.value_model: a
  // model folder or a Hugging Face folder): a one-label classifier, or a
  // causal LM given a score head. nk::Error naming align.value_model for a
  // missing folder, a classifier of more labels, or a vocabulary other than
  // the policy's (policy_vocab).
  Critic(const TrainConfig& run, const std::string& dir, int64_t policy_vocab);

  Transformer& model() { return *model_; }
  // Values [B * T] at every position of i32 [B, T] tokens on the model's
  // device (the round's, and a micro-batch's); backward() then accumulates
  // the gradients of sum_i dvalues[i] * values[i].
  void forward(const Tensor& tokens, std::span<float> out);
  void backward(const Tensor& tokens, std::span<const float> dvalues);
  // The step's gradients summed by `sum` (ObjectiveRanks::sum_own_grads;
  // null on one process): their squared norm.
  double reduce_grads(const std::function<void(Tensor&)>& sum);
  // The update at the policy's rate and clip factor; the gradients zeroed.
  void step(double lr, float clip);
  // OUT_DIR/critic/checkpoints/step_N: the weights, AdamW's moments and
  // update count (train_checkpoint.h's format). Written by the rank that
  // writes (`writes`).
  void save_checkpoint(int64_t step, bool writes);
  // The checkpoint of `step` read back (resume): from train.resume_from's
  // run (OUT/critic/checkpoints beside the checkpoint or run it names) when
  // given, else this run's; nk::Error naming the folder where it is missing.
  void load_checkpoint(int64_t step);
  // The weights as a model folder, OUT_DIR/critic/model.
  void export_model();

 private:
  TrainConfig cfg_;  // the critic's own: its model, OUT_DIR/critic
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<Activations> acts_;  // training activations, micro_batch x seq_len
};

}  // namespace nk
