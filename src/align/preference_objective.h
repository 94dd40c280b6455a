// Preference optimisation as a TrainObjective: the Trainer's loop, resume,
// checkpoints and export, with each micro-batch's loss from
// preference_loss.h. A micro-batch of 2n rows holds n examples (rows 2i,
// 2i+1: preference_data.h); one forward of the policy gives every row's
// completion log-probability (Transformer::head_row_nll), the loss gives
// d loss / d logp per row, and one backward takes those as per-row weights
// on the token cross-entropy (head_row_backward, then the blocks' and
// embedding's backward over the same activations).
#pragma once
#include <deque>
#include <memory>

#include "align/align_config.h"
#include "align/preference_data.h"
#include "align/reference.h"
#include "train/train_objective.h"

namespace nk {

class PreferenceObjective : public TrainObjective {
 public:
  // train, valid (may be null): the data, read before anything is written.
  PreferenceObjective(const TrainConfig& cfg, const AlignConfig& align,
                      std::shared_ptr<const PreferenceData> train,
                      std::shared_ptr<const PreferenceData> valid, int32_t pad_id);
  TrainData data(const TrainConfig& cfg) override;
  // The reference: precomputed (or read back), a frozen copy, or nothing to
  // do (the adapters switched off each micro-batch).
  void prepare(Transformer& model, bool fresh) override;
  double train_micro_batch(Transformer& model, Activations& a, const MicroBatch& batch,
                           float grad_scale) override;
  double eval_micro_batch(Transformer& model, Activations& a, const MicroBatch& batch) override;
  // TRL's names: rewards/chosen, rewards/rejected, rewards/margins,
  // rewards/accuracies (paired), logps/chosen, logps/rejected, kl (KTO),
  // nll_loss (with an NLL term).
  ObjectiveMetrics take_metrics(bool eval) override;
  // Data parallel: every reference; adapter_off's log-probabilities come
  // from before_staged's forward with the adapters off.
  bool staged() const override { return true; }
  void before_staged(Transformer& model, const MicroBatch& batch, bool train,
                     const StagedForward& forward) override;
  // Context parallel: each row's sums over the cp ranks; a frozen copy's
  // forward reads the whole rows (MicroBatch::whole_tokens) on every cp rank.
  bool splits_rows() const override { return true; }
  double head_micro_batch(Transformer& model, Activations& a, const MicroBatch& batch,
                          float grad_scale, bool train) override;

  // Whether prepare() computed the reference pass (false: read back or none).
  bool computed_reference() const { return computed_reference_; }

 private:
  double run(Transformer& model, Activations& a, const MicroBatch& batch, float grad_scale,
             bool train);
  bool adapter_off_reference() const;  // a reference, the policy with its adapters off
  // After the policy's forward: the loss, its head backward (`train`) and
  // the figures. ref_logp: the reference's, when run() computed them.
  double head(Transformer& model, Activations& a, const MicroBatch& batch, float grad_scale,
              bool train, std::vector<double> ref_logp);
  TrainConfig cfg_;
  AlignConfig align_;
  std::shared_ptr<const PreferenceData> train_data_, valid_data_;
  std::shared_ptr<PreferenceDataset> train_, valid_;
  std::vector<double> ref_train_, ref_valid_;  // precomputed, by sequence
  std::unique_ptr<Transformer> ref_model_;     // reference=copy
  std::unique_ptr<Activations> ref_acts_;
  // reference=adapter_off, staged: before_staged's log-probabilities, taken
  // in order by the head_micro_batch calls that follow (a pipeline's step
  // computes all of its micro-batches' first; empty between steps).
  std::deque<std::vector<double>> staged_refs_;
  bool computed_reference_ = false;
  struct Sums {
    PreferenceFigures f;
    int64_t batches = 0, pairs = 0;
  };
  Sums train_sums_, eval_sums_;
};

}  // namespace nk
