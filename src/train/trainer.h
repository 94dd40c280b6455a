// The single-process training loop: micro-batches with gradient accumulation,
// global-norm clipping, AdamW with warmup + cosine decay, periodic validation,
// a log line and a JSONL record per step, full checkpoints in OUT/checkpoints
// (every train.save_every steps, at the end, and on SIGTERM/SIGINT) from which
// a rerun continues bit for bit, and the final model exported to OUT/model.
#pragma once
#include <functional>
#include <memory>
#include <optional>

#include "core/output_lock.h"
#include "data/dataset/data_loader.h"
#include "parallel/distributed_data_parallel.h"
#include "parallel/pipeline_parallel.h"
#include "train/adamw.h"
#include "train/train_checkpoint.h"
#include "train/train_config.h"
#include "train/train_data.h"
#include "train/train_objective.h"
#include "train/train_parallel.h"
#include "train/trainer_state.h"

namespace nk {

struct StepStats {
  int64_t step = 0;  // 1-based
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, mfu = 0, step_ms = 0;
  double val_loss = NAN;  // set on validation steps
  size_t peak_bytes = 0;  // Nekton tensors' peak
  double comm_ms = 0;     // data parallel: waiting for gradients after the backward, and
                          // (ZeRO-1, FSDP) for weight gathers during the step
  // Sharded gradients (ZeRO-2, FSDP): the most bytes of this rank's gradient
  // arena resident at the end of a backward stage in the step (0 otherwise).
  size_t grad_resident_bytes = 0;
};

class Trainer {
 public:
  // Loads the data (building or loading its indices) and builds the model, or
  // resumes: from train.resume_from, else (train.resume=auto) from the newest
  // valid checkpoint in OUT_DIR/checkpoints, restoring weights, AdamW moments,
  // step, LR position and data position (nk::Error if the data settings or the
  // model differ, or a file is missing or corrupt). Nothing is written yet.
  // `par`: the processes of a data-parallel run (TrainParallel; default one
  // process): each rank reads its slice of every global batch (dp_slice.h),
  // gradients are summed over "dp-cp" in buckets, the logged loss is the
  // global mean, and only rank 0 prints, writes metrics and the model, and
  // checkpoints (with parallel.shard every rank also writes its shard). A
  // checkpoint of any layout resumes under any other. nk::Error naming the
  // keys for a layout it cannot train.
  // `objective`: what each micro-batch minimises (train_objective.h); null:
  // language modelling (LmObjective). Another objective runs on one process.
  explicit Trainer(const TrainConfig& cfg, TrainParallel par = {},
                   std::shared_ptr<TrainObjective> objective = nullptr);
  ~Trainer();
  // Runs the steps from state().step to train.steps (or train.exit_at_step);
  // `on_step` (optional) sees every step's figures. Writes OUT_DIR/metrics.jsonl
  // as it goes (continuing it when resumed), a checkpoint every
  // train.save_every steps and at the end, then OUT_DIR/model with
  // trainer_state.json. SIGTERM or SIGINT during run() ends it cleanly after
  // the current step with a checkpoint (and no model export); stopped() then
  // says so. A non-finite loss or gradient stops with nk::Error naming the step.
  void run(const std::function<void(const StepStats&)>& on_step = {});
  // The signal that ended the last run() early (SIGTERM, SIGINT), or 0.
  int stopped() const { return stopped_by_; }
  // Sees every training micro-batch before its forward pass (step is 1-based).
  using BatchObserver =
      std::function<void(int64_t step, const Tensor& inputs, const Tensor& targets)>;
  void set_batch_observer(BatchObserver f) { on_batch_ = std::move(f); }
  // Runs on the steps train.eval_tasks names (every train.eval_tasks_every
  // steps and the last), on every rank (each holds the whole model; no
  // collective inside, so no rank waits past the timeout on another), after
  // the validation; its figures join the step's log line and metrics record.
  // nk::Error naming train.eval_tasks when the model is split over ranks
  // (tensor, pipeline or expert parallel, FSDP).
  using StepEvaluator = std::function<std::vector<std::pair<std::string, double>>(int64_t step)>;
  void set_step_evaluator(StepEvaluator f);
  const TrainerState& state() const { return state_; }
  Transformer& model() { return *model_; }
  const AdamW& optimizer() const { return *opt_; }
  const std::vector<StepStats>& history() const { return history_; }
  double evaluate();  // mean validation loss over val_batches micro-batches

 private:
  // Another objective (trainer_objective_ranks.cc): nk::Error unless it
  // trains under this layout; what it is told of the ranks before
  // prepare() (`acts`: run()'s workspace, which its row_nll borrows under
  // FSDP and context parallelism); its forward before the staged micro-batch
  // (TrainObjective::before_staged), through the pipeline's stages, or
  // through ddp_ in `a` (data parallel).
  void check_objective_layout() const;
  ObjectiveRanks objective_ranks(std::optional<Activations>& acts);
  void before_staged(Activations* a, const MicroBatch& mb, bool train);
  // optim.master_dtype=bf16: for its lifetime the model holds f32 masters again
  // (the optimizer's exact ones), what a checkpoint save or the export reads;
  // nothing with an f32 master (opt null or not master_in_compute). Under
  // ZeRO-1 and FSDP a rank's optimizer holds the exact masters of its blocks only:
  // with `join` (the data-parallel group; collective) every rank's blocks are
  // put together, so each holds the whole model's (split experts' blocks
  // over `experts`, the expert-dp group).
  class MastersOnLoan {
   public:
    MastersOnLoan(Transformer& model, const AdamW* opt, dist::Communicator* join = nullptr,
                  dist::Communicator* experts = nullptr);
    ~MastersOnLoan();
    MastersOnLoan(const MastersOnLoan&) = delete;
    MastersOnLoan& operator=(const MastersOnLoan&) = delete;

   private:
    Transformer* model_;
  };
  void resume();         // from train.resume_from or OUT_DIR/checkpoints, if any
  void resume_legacy();  // from an exported model/ folder: weights and data position
  void resume_checkpoint(const std::string& dir);
  // A checkpoint of state_.step, then the objective told of it.
  void save_checkpoint_now();
  void save_checkpoint_files();
  // After the last step: the whole model (gathered under FSDP, tensor and
  // pipeline parallelism) to OUT_DIR/model with the tokenizer, and the
  // adapter alone for PEFT runs; rank 0 writes (trainer_save.cc).
  void export_final();
  // nk::Error before any save when an update left NaN or Inf in the weights
  // (on any rank), naming the first such tensor: a non-finite model is never
  // written, so the newest checkpoint stays the last good one.
  void check_weights_finite() const;
  // Builds opt_ over the model's groups (sharded by ddp_ under parallel.shard=
  // optimizer) and adopts moments a resume read, if any.
  void make_optimizer();
  // train.init_from naming a Hugging Face folder: rank 0 imports it into
  // OUT_DIR/base once (kept for resumed runs and for serving the adapter).
  void import_hf_base();
  TrainConfig cfg_;
  TrainParallel par_;
  // OUT_DIR/.nekton.lock, held by the writing rank (rank 0) from construction
  // to the end of run(): a second run on the same folder fails at once
  // instead of mixing in.
  std::optional<OutputLock> out_lock_;
  std::shared_ptr<TrainObjective> objective_;
  bool custom_objective_ = false;
  TrainData data_;
  TrainerState state_;
  BatchObserver on_batch_;
  StepEvaluator step_eval_;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<AdamW> opt_;
  std::optional<LoadedTrainCheckpoint>
      resumed_;  // moments read by resume(), until make_optimizer()
  std::unique_ptr<parallel::DistributedDataParallel> ddp_;  // null for one process
  // Expert parallel: seconds in the MoE layers' all-to-alls (null without).
  std::shared_ptr<double> a2a_seconds_;
  // Pipeline parallel: the schedule over this rank's stage (null without).
  std::unique_ptr<parallel::PipelineParallel> pipe_;
  // The micro-batches the schedule runs (another objective's head reads them).
  std::vector<MicroBatch> pipe_batches_;
  // The model's tensor-parallel group (size 1 without).
  nn::TensorParallel tensor_parallel() const;
  // This rank's pipeline stage (the whole model without pipelining).
  PipelineStage pipeline_stage() const;
  // Whether the model is split over ranks (tensor or pipeline parallel).
  bool model_parallel() const { return tensor_parallel().active() || par_.pp() > 1; }
  // Each rank holds a piece of the model: model parallel, or split experts
  // (saves and exports gather the whole).
  bool pieces_model() const { return model_parallel() || (model_ && model_->experts_split()); }
  // A host int's max over every rank (agreement on signals and bad weights).
  int max_over_ranks(int v) const;
  // Model parallel: the whole model gathered from the ranks' pieces, on the
  // writing rank (null on the others) or `everywhere`, held as this one is; a
  // base held without masters only with_base (the export; a checkpoint holds
  // the trainable parameters alone). Collective.
  std::unique_ptr<Transformer> gather_whole_model(bool with_base, bool everywhere = false);
  // An online objective's policy where the model is in pieces or context
  // parallel (ObjectiveRanks::whole_policy): the live weights gathered whole
  // on every rank, with the model's logit temperature; into `previous` only
  // the trainable parameters, where the model has frozen ones. Collective.
  std::unique_ptr<Transformer> whole_policy(std::unique_ptr<Transformer> previous);
  // This rank's model piece whole across its data-parallel replicas: the
  // f32 master weights, or an optimizer moment (opt_->m() or v()) laid out
  // as the trainable parameters; under a distributed optimizer (ZeRO-1)
  // put together from every replica's blocks (collective), else the arena
  // itself.
  Tensor replica_weights();
  Tensor replica_state(const Tensor& state);
  // The squared gradient norm of a model-parallel run (parallel/model_parallel).
  double model_parallel_grad_norm_squared();
  std::vector<StepStats> history_;
  int64_t saved_step_ = -1;  // the step of the newest checkpoint in OUT_DIR/checkpoints
  int stopped_by_ = 0;
};

// Measured peak of the compute dtype's matrix product on `device` (FLOP/s), for MFU.
double measure_gemm_peak(DType dtype, Device device);

}  // namespace nk
