#include "train/train_objective.h"

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

}  // namespace nk
