// SteerLM's attribute model (NeMo-Aligner's regression reward model):
// `align.method=rm align.reward_model_type=regression` trains a classifier of
// one output per attribute (ModelConfig::num_labels, labels = the names) to
// predict each record's attribute values (attribute_data.h) at its last
// token, the mean squared error over the labelled values:
//
//   loss = sum over rows b, labelled attributes j of (s_bj - y_bj)^2 / count
#pragma once
#include <memory>

#include "align/attribute_data.h"
#include "train/train_objective.h"

namespace nk {

class AttributeObjective : public TrainObjective {
 public:
  AttributeObjective(const TrainConfig& cfg, std::shared_ptr<const AttributeData> train,
                     std::shared_ptr<const AttributeData> valid, int32_t pad_id, bool shuffle);
  TrainData data(const TrainConfig& cfg) override;
  double train_micro_batch(Transformer& model, Activations& a, const MicroBatch& batch,
                           float grad_scale) override;
  double eval_micro_batch(Transformer& model, Activations& a, const MicroBatch& batch) override;
  // mse, and mse/NAME per attribute over its labelled values.
  ObjectiveMetrics take_metrics(bool eval) override;
  bool staged() const override { return true; }
  // Context parallel: the rank holding a row's last position scores it
  // (TrainObjective::score_rows).
  bool splits_rows() const override { return true; }
  double head_micro_batch(Transformer& model, Activations& a, const MicroBatch& batch,
                          float grad_scale, bool train) override;

 private:
  TrainConfig cfg_;
  std::shared_ptr<const AttributeData> train_data_, valid_data_;
  std::shared_ptr<AttributeDataset> train_, valid_;
  struct Sums {
    std::vector<double> squared, count;  // per attribute
  };
  Sums train_sums_, eval_sums_;
};

}  // namespace nk
