// What the Trainer minimises, one micro-batch at a time: the seam between the
// training loop (data order, accumulation, clipping, AdamW, checkpoints,
// resume, metrics, signals, export) and the loss. The default is the language
// model's token-mean cross-entropy (Transformer::forward_backward); the
// preference objectives of src/align supply their own, so a higher layer
// plugs in without the loop knowing it.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "model/transformer.h"
#include "train/train_data.h"

namespace nk {

// One micro-batch as the loop loaded it: i32 [B, T] on the model's device,
// their host copies, the packed rows' boundaries (or null) and the dataset
// index of row 0's sample (row b is sample first_sample + b).
struct MicroBatch {
  const Tensor& tokens;
  const Tensor& targets;
  const Tensor& host_tokens;
  const Tensor& host_targets;
  const PackedBatchInfo* packed = nullptr;
  int64_t first_sample = 0;
  // Context parallel: the whole rows of which tokens and targets are this
  // rank's chunks (host memory); null otherwise.
  const Tensor* whole_tokens = nullptr;
  const Tensor* whole_targets = nullptr;
};

// Named figures for the log line and metrics.jsonl ("rewards/chosen", ...).
using ObjectiveMetrics = std::vector<std::pair<std::string, double>>;

// Where the objective runs, given by the Trainer before prepare(). One
// process: the defaults. Data parallel: `writes` on rank 0 only; `whole_model`
// false where no rank's model forwards whole rows by itself (FSDP's shards,
// a pipeline stage, context parallel chunks), so prepare() must not run it
// (row_nll does); `sum_over_ranks` sums numbers over the data-parallel
// replicas in place (collective: every rank calls it at the same point).
struct ObjectiveRanks {
  bool writes = true;
  bool whole_model = true;
  int64_t dp = 1, dp_rank = 0;  // the data-parallel replicas and this rank's place among them
  std::function<void(std::span<double>)> sum_over_ranks = [](std::span<double>) {};
  // Pipeline parallel: the last stage's numbers on every stage (only the last
  // runs the objective's head; collective over the stages). Nothing otherwise.
  std::function<void(std::span<double>)> from_last_stage = [](std::span<double>) {};
  // An objective's own model, whole on every rank and trained on the rows
  // its head sees (PPO's critic): own_grads false where this rank's head
  // repeats another's rows (a tensor-parallel peer but rank 0) or never
  // runs (a pipeline stage but the last), so it leaves that model's
  // gradients at zero; sum_own_grads sums them in place (f32 on the model's
  // device) so that every rank holds the step's (collective): over the
  // data-parallel replicas where the policy is whole, over every rank
  // where it is in pieces or forwards chunks of rows (each context-parallel
  // rank adds its own positions' part). Nothing on one process.
  bool own_grads = true;
  std::function<void(Tensor&)> sum_own_grads = [](Tensor&) {};

  // Context parallel: each rank holds cp_rank's chunks of every row's
  // tokens (and a row's sums are the cp ranks' parts): sum_over_sequence
  // sums per-row numbers over the cp group (collective). Nothing otherwise.
  int64_t cp = 1;
  std::function<void(std::span<double>)> sum_over_sequence = [](std::span<double>) {};
  // Where no rank's model runs a forward by itself (a pipeline stage, FSDP's
  // shards, context parallel chunks): row_nll(tokens, targets, nll) sets
  // nll[b] to the sum of -log p(target) over row b of whole i32
  // [train.micro_batch, train.seq_len] tokens and targets on the model's
  // device, by the distributed model's forward (no gradients), on every
  // rank; collective. For prepare() (it runs in the Trainer's workspaces of
  // that run). Null elsewhere.
  std::function<void(const Tensor& tokens, const Tensor& targets, std::span<double> nll)> row_nll;
  // Online objectives (generation in the loop). The ranks that share a
  // round's generations (each generates those k with k % generators =
  // generator) and sum_over_generators, which sums numbers over them
  // (collective): the data-parallel replicas where each rank's model is
  // whole, every rank where it is in pieces.
  int64_t generators = 1, generator = 0;
  std::function<void(std::span<double>)> sum_over_generators = [](std::span<double>) {};
  // Where a tensor-parallel group generates together from its pieces of
  // the policy (Transformer::forward_cached under tensor parallelism; no
  // whole_policy): its ranks generate the same completions, rank 0 alone
  // scores them (`scores`) and fills their figures, the others adding
  // zeros to sum_over_generators (then over every rank).
  bool scores = true;
  // Where the model is in pieces (tensor, pipeline or expert parallel,
  // FSDP) or forwards chunks of rows (context parallel): the policy's live weights
  // gathered into a whole model, held as the policy is (a frozen bf16 base
  // as bf16), on every rank, for generation and the round's
  // log-probabilities (collective; null where each rank's model is whole).
  // Given the copy it returned before (null the first time), it gathers
  // only the trainable parameters into it where the rest is frozen
  // (adapters over a frozen base: the base gathered once), else a new copy.
  // And whether this rank writes its replica's files (one rank of each
  // data-parallel replica: its tensor, pipeline and context parallel peers
  // hold the same).
  std::function<std::unique_ptr<Transformer>(std::unique_ptr<Transformer> previous)> whole_policy;
  bool replica_writes = true;
  // With whole_policy: the ranks of this data-parallel replica (its tensor,
  // context and pipeline parallel peers), this rank's place among them, and
  // a sum over them (collective), to share the replica's work on whole
  // models.
  int64_t replica_peers = 1, replica_peer = 0;
  std::function<void(std::span<double>)> sum_over_replica_peers = [](std::span<double>) {};
};

class TrainObjective {
 public:
  virtual ~TrainObjective() = default;
  void set_ranks(ObjectiveRanks r) { ranks_ = std::move(r); }
  // The datasets to read (the default objective: build_train_data(cfg)).
  virtual TrainData data(const TrainConfig& cfg) = 0;
  // Once before the first step of run(), with the model as built or resumed
  // (`fresh`: no step taken yet, so it holds the initial weights) and
  // OUT_DIR created: work the objective does before training.
  virtual void prepare(Transformer& /*model*/, bool /*fresh*/) {}
  // Forward, loss and backward of one training micro-batch: gradients
  // ACCUMULATE d(loss * grad_scale) / d params. Returns the micro-batch loss.
  virtual double train_micro_batch(Transformer& model, Activations& a, const MicroBatch& batch,
                                   float grad_scale) = 0;
  // The loss of one validation micro-batch (a forward only).
  virtual double eval_micro_batch(Transformer& model, Activations& a, const MicroBatch& batch) = 0;
  // Online objectives (RL) make their data as they train. true: the Trainer
  // calls before_step at the start of every step (0-based), before the
  // step's micro-batches are loaded, with the model holding the weights the
  // last update left on every rank (collective under data parallelism), and
  // checkpoint_saved after each checkpoint of `step` steps is written.
  virtual bool online() const { return false; }
  virtual void before_step(Transformer& /*model*/, int64_t /*step*/) {}
  virtual void checkpoint_saved(int64_t /*step*/) {}
  // The figures gathered since the last call (training micro-batches, or
  // with `eval` the validation ones), averaged; cleared. None by default.
  // Training figures are means over every rank's micro-batches (collective
  // under data parallelism); validation ones: every rank reads the same.
  virtual ObjectiveMetrics take_metrics(bool /*eval*/) { return {}; }
  // An objective that trains a model of its own beside the Trainer's (PPO's
  // separate critic: TRL's value model): after the step's micro-batches,
  // its gradients summed over the data-parallel replicas and their squared
  // norm (collective), which the Trainer adds to its model's before
  // clipping (TRL clips the policy and value model under one norm); then,
  // after the model's update, its own with the step's rate and clip factor.
  // Before each checkpoint of `step` steps (collective), its state beside
  // it, so a resumed run finds the state of the step it resumes. None by
  // default.
  virtual double own_grad_norm_squared() { return 0; }
  virtual void own_step(double /*lr*/, float /*clip*/) {}
  virtual void save_state(int64_t /*step*/) {}
  // An online objective's validation, at each validation step in place of
  // validation micro-batches (which it has none of): its figures over its
  // validation data with the model's current weights (collective under
  // data parallelism); none by default.
  virtual ObjectiveMetrics validate(Transformer& /*model*/) { return {}; }

  // The staged form data parallelism runs (DistributedDataParallel, whose
  // hooks gather weights and start gradient reductions between the stages):
  // a micro-batch after the caller ran the embedding and blocks forward;
  // `train` ends with the head's backward (Transformer::head_row_backward),
  // leaving a.dres for the caller's blocks and embedding backward. Returns
  // the loss. Objectives without it (staged() false) run on one process.
  virtual bool staged() const { return false; }
  virtual double head_micro_batch(Transformer& /*model*/, Activations& /*a*/,
                                  const MicroBatch& /*batch*/, float /*grad_scale*/,
                                  bool /*train*/) {
    fail("this training objective has no staged form (it runs on one process)");
  }
  // The staged form's forward without gradients: the embedding and blocks
  // (gathering weights as the training forward does; under pipeline
  // parallelism the stages in turn), then `head` over the activations they
  // left, on the rank that holds the head (a pipeline's last stage: the
  // others do not call it); returns what `head` returns there.
  using StagedForward = std::function<double(const std::function<double(Activations&)>& head)>;
  // Before each staged micro-batch (training or validation; under pipeline
  // parallelism all of a step's, in order, before its schedule): a forward
  // of the objective's own through `forward` whose results head_micro_batch
  // reads (a reference with the policy's adapters off). Its activations are
  // overwritten by the policy's forward that follows. Nothing by default.
  virtual void before_staged(Transformer& /*model*/, const MicroBatch& /*batch*/, bool /*train*/,
                             const StagedForward& /*forward*/) {}
  // Whether head_micro_batch sums each row's parts over the context-parallel
  // ranks (ObjectiveRanks::sum_over_sequence; each holds its chunks of the
  // rows) and returns its loss's 1 / cp share: false, refused under context
  // parallelism.
  virtual bool splits_rows() const { return false; }
  // align.moe_losses: a Mixture of Experts model's balancing and z-losses
  // (model.moe_aux_loss_coeff, model.moe_z_loss_coeff) join an objective of
  // its own as they join the language model's cross-entropy; off (the
  // default) the routers learn from the objective alone.
  void set_moe_losses(bool on) { moe_losses_ = on; }

 protected:
  // The weight of the MoE losses' gradient for a micro-batch the loop
  // weights by grad_scale (Transformer::head_row_backward's
  // moe_grad_scale): grad_scale with align.moe_losses, else 0.
  float moe_grad_scale(float grad_scale) const { return moe_losses_ ? grad_scale : 0.f; }
  // Their share of a training micro-batch's loss, after its forward (0
  // without align.moe_losses or experts): under context parallelism each
  // rank's losses are the whole rows', so each cp rank adds 1 / cp of them,
  // as Transformer::head_loss does.
  double moe_loss(const Transformer& model, const Activations& a) const;
  // take_metrics' sums of this rank's micro-batches: the training ones over
  // the data-parallel replicas (validation's are every replica's alike),
  // then, under pipeline parallelism, the last stage's to every stage.
  // Collective.
  void sum_figures(std::span<double> v, bool eval) const {
    if (!eval) ranks_.sum_over_ranks(v);
    ranks_.from_last_stage(v);
  }
  // A staged objective's micro-batch on one process: the embedding and
  // blocks forward, `head` (its head_micro_batch: the loss, and with `train`
  // the head's backward into a.residual_grad()), then with `train` the
  // blocks' and embedding's backward; returns what `head` returns. What
  // DistributedDataParallel runs in stages, in one piece.
  static double whole_micro_batch(Transformer& model, Activations& a, const MicroBatch& batch,
                                  bool train, const std::function<double()>& head);
  // A sequence classifier's scores [B * num_labels] at each row's position
  // last[b] (Transformer::score_forward). Under context parallelism the rank
  // whose chunks hold a row's position scores it and the cp ranks sum the
  // scores (collective), so every rank has them all; `last` is left as this
  // rank's local positions (-1: another rank's), for score_backward.
  void score_rows(Transformer& model, Activations& a, const MicroBatch& batch,
                  std::vector<int64_t>& last, std::span<float> scores) const;
  ObjectiveRanks ranks_;

 private:
  bool moe_losses_ = false;
};

// Language modelling: the mean cross-entropy over the non-ignored targets.
class LmObjective : public TrainObjective {
 public:
  TrainData data(const TrainConfig& cfg) override;
  double train_micro_batch(Transformer& model, Activations& a, const MicroBatch& batch,
                           float grad_scale) override;
  double eval_micro_batch(Transformer& model, Activations& a, const MicroBatch& batch) override;
};

}  // namespace nk
