#include "train/train_objective.h"

#include <algorithm>

namespace nk {

TrainData LmObjective::data(const TrainConfig& cfg) {
  return build_train_data(cfg);
}

double LmObjective::train_micro_batch(Transformer& model, Activations& a, const MicroBatch& batch,
                                      float grad_scale) {
  return model.forward_backward(a, batch.tokens, batch.targets, grad_scale, batch.packed);
}

double LmObjective::eval_micro_batch(Transformer& model, Activations& a, const MicroBatch& batch) {
  return model.forward_loss(a, batch.tokens, batch.targets, batch.packed);
}

double TrainObjective::whole_micro_batch(Transformer& model, Activations& a,
                                         const MicroBatch& batch, bool train,
                                         const std::function<double()>& head) {
  const int64_t L = model.config().n_layer;
  model.embed_forward(a, batch.tokens);
  model.blocks_forward(a, 0, L);
  const double loss = head();
  if (train) {
    model.blocks_backward(a, 0, L);
    model.embed_backward(a, batch.tokens);
  }
  return loss;
}

double TrainObjective::moe_loss(const Transformer& model, const Activations& a) const {
  if (!moe_losses_ || !model.config().is_moe()) return 0;
  return model.moe_losses(a).total(model.config()) / double(ranks_.cp);
}

void TrainObjective::score_rows(Transformer& model, Activations& a, const MicroBatch& batch,
                                std::vector<int64_t>& last, std::span<float> scores) const {
  if (ranks_.cp > 1) {
    // Position j of this rank's chunks is position pos[j] of every row.
    NK_CHECK(batch.packed && batch.packed->position_ids.defined() &&
                 batch.packed->position_ids.device() == kHost,
             "score_rows under context parallelism: the micro-batch's positions");
    const int32_t* pos = batch.packed->position_ids.data<int32_t>();
    for (int64_t& p : last) {
      int64_t local = -1;
      for (int64_t j = 0; j < a.T && local < 0; ++j)
        if (pos[j] == p) local = j;
      p = local;
    }
  }
  model.score_forward(a, last, scores);
  if (ranks_.cp == 1) return;
  std::vector<double> v(scores.begin(), scores.end());
  ranks_.sum_over_sequence(v);  // the other ranks' rows are 0 here
  std::copy(v.begin(), v.end(), scores.begin());
}

}  // namespace nk
