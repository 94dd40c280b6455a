// A reward model's training (align.method=rm) as a TrainObjective: the
// policy is a sequence classifier (ModelConfig::num_labels = 1) whose score
// at each sequence's last token is its reward; pairs of rows (chosen,
// rejected: preference_data.h) take the Bradley-Terry loss of reward_loss.h.
// One forward of the blocks, the score head at the rows' last tokens
// (Transformer::score_forward), and the backward from d loss / d reward.
#pragma once
#include <memory>

#include "align/align_config.h"
#include "align/preference_data.h"
#include "train/train_objective.h"

namespace nk {

class RewardObjective : public TrainObjective {
 public:
  // train, valid (may be null): the pairs, read before anything is written.
  RewardObjective(const TrainConfig& cfg, const AlignConfig& align,
                  std::shared_ptr<const PreferenceData> train,
                  std::shared_ptr<const PreferenceData> valid, int32_t pad_id);
  TrainData data(const TrainConfig& cfg) override;
  double train_micro_batch(Transformer& model, Activations& a, const MicroBatch& batch,
                           float grad_scale) override;
  double eval_micro_batch(Transformer& model, Activations& a, const MicroBatch& batch) override;
  // rewards/chosen, rewards/rejected, rewards/margins, rewards/accuracies
  // (the names the preference objectives log; TRL's RewardTrainer logs the
  // accuracy and margin).
  ObjectiveMetrics take_metrics(bool eval) override;
  bool staged() const override { return true; }
  // Context parallel: the rank holding a row's last position scores it
  // (TrainObjective::score_rows).
  bool splits_rows() const override { return true; }
  double head_micro_batch(Transformer& model, Activations& a, const MicroBatch& batch,
                          float grad_scale, bool train) override;

 private:
  TrainConfig cfg_;
  AlignConfig align_;
  std::shared_ptr<const PreferenceData> train_data_, valid_data_;
  std::shared_ptr<PreferenceDataset> train_, valid_;
  struct Sums {
    double chosen = 0, rejected = 0, correct = 0;
    int64_t pairs = 0;
  };
  Sums train_sums_, eval_sums_;
};

}  // namespace nk
