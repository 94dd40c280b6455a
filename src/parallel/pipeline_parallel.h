// Pipeline parallelism: the layers split into stages over the mesh's "pp"
// group (each process holds its stage's parameters: PipelineStage), every
// micro-batch's residual stream sent forward from stage to stage and its
// gradient backward, point to point, in Megatron's 1F1B order: stage s of p
// runs min(p - s - 1, m) forwards first (warm-up), then alternates one
// forward and one backward, then finishes the backwards, so it holds at
// most p - s micro-batches' activations at once.
//
// Transfers: a send is posted without waiting, and completed together with
// the stage's next receive (Megatron's send_forward_recv_backward and
// send_backward_recv_forward): MPI moves a large message only while both
// sides are inside MPI, so a send left pending across the next layer's
// compute would hold the neighbour up for that long.
//
// The first stage reads the tokens and runs the embedding, the last the
// final norm, the head and the loss; the step's loss reaches every stage.
// With tied embeddings the last stage holds a copy of the token table for
// its head, initialised alike; reduce_embedding_grads() sums the two
// stages' gradients of it (the "embedding" group), so both copies take
// the same update and stay equal.
#pragma once
#include <memory>
#include <vector>

#include "dist/communicator.h"
#include "model/transformer.h"

namespace nk::parallel {

// The stage of pipeline rank `rank` of `pp` for a model of cfg: the layers
// split evenly, or as `layers` says (layers per stage, in order, summing to
// cfg.n_layer: parallel.pp_layout; a stage may have none). nk::Error naming
// the key and the numbers when they do not fit.
PipelineStage pipeline_stage(const ModelConfig& cfg, int64_t pp, int64_t rank,
                             const std::vector<int64_t>& layers = {});

class PipelineParallel {
 public:
  // pp: the pipeline group (stage = group rank); embedding: the first and
  // last stages' group, for tied embeddings (null otherwise). Activations
  // for micro-batches of B x T are made for the at most p - s in flight
  // (recompute: the run's plan). The model and groups must outlive this.
  PipelineParallel(Transformer& model, dist::Communicator& pp, dist::Communicator* embedding,
                   int64_t B, int64_t T, const std::vector<Recompute>& recompute);

  // One step over the micro-batches tokens[i], targets[i] (i32 [B, T]; the
  // first stage reads the tokens, the last the targets), in 1F1B order;
  // gradients ACCUMULATE d(loss_i * grad_scale)/d params as
  // Transformer::forward_backward does. Returns the sum of the
  // micro-batches' mean losses, on every stage. Collective over pp.
  double forward_backward(const std::vector<Tensor>& tokens, const std::vector<Tensor>& targets,
                          float grad_scale);
  // One micro-batch's mean loss without gradients (validation), on every stage.
  double forward_loss(const Tensor& tokens, const Tensor& targets);
  // Tied embeddings: the token table's gradient summed over the first and
  // last stages (once per step, after the backward). Nothing otherwise.
  void reduce_embedding_grads();
  // Whether p's gradient counts in the global norm on this stage (the last
  // stage's copy of a tied token table does not: the first stage's counts).
  bool counts_in_norm(const ParamInfo& p) const;
  // Bytes of the activation workspaces this stage keeps.
  int64_t activation_bytes() const;
  int64_t in_flight() const { return int64_t(acts_.size()); }
  // Seconds this stage waited on its neighbours (received activations or
  // gradients, completed sends) since the last call: the pipeline's bubble
  // plus the transfers it did not overlap.
  double take_wait_seconds() {
    const double s = wait_s_;
    wait_s_ = 0;
    return s;
  }

 private:
  void forward(int64_t slot, const Tensor& tokens, const Tensor& targets, bool backward,
               float grad_scale, double& loss);
  void backward(int64_t slot, const Tensor& tokens);
  // Receives x from group rank `src`, completing every pending send meanwhile.
  void receive(const Tensor& x, int src, int tag);
  void wait_sends();
  double from_last_stage(double v);

  Transformer& model_;
  dist::Communicator& pp_;
  dist::Communicator* embedding_;
  int64_t stage_, stages_, first_, last_;
  std::vector<std::unique_ptr<Activations>> acts_;  // one per micro-batch in flight
  std::vector<dist::WorkPtr> sending_;              // posted, not yet complete
  double wait_s_ = 0;
};

}  // namespace nk::parallel
