// Data parallelism over a replicated Transformer: every rank of the gradient
// group (Megatron's "dp-cp") runs its own micro-batches, and the gradient
// buckets (grad_buckets.h) are summed over the group with non-blocking
// all-reduces, so after wait_grads() every rank holds the same gradients.
//
// Averaging: the reduction is a sum. The caller scales each micro-batch's loss
// by 1 / (micro-batches per step over ALL ranks), exactly the factor a single
// process would use for the same global batch, so the summed gradient is the
// single-process gradient (the mean over micro-batches of each micro-batch's
// token-mean loss gradient) up to the order of the additions.
//
// Distributed optimizer (cfg.shard = Optimizer, ZeRO-1): each bucket is
// reduce-scattered instead (shard_counts: rank j receives the sum of block j
// only), this rank's optimizer updates just its blocks (optimizer_pieces),
// and gather_params() starts the all-gather of the updated compute-dtype
// weights, bucket by bucket, without waiting: the next forward waits for a
// bucket only when the first stage that reads it is about to run, so the
// gathers overlap the start of the next step. Anything else that reads the
// weights first calls finish_param_gathers(). With bf16 compute the f32
// master weights are sharded too, as in Megatron: each rank keeps only its
// blocks of them resident (release_other_blocks), 6 + 12/dp bytes per
// parameter in all; f32 compute keeps them whole (they are the weights the
// kernels read): 8 + 8/dp.
// The gradient norm is a sum over the ranks' blocks (grad_norm_squared).
//
// ZeRO-2 (cfg.shard = Gradients): as the distributed optimizer, and every
// micro-batch reduces (not only a step's last): each bucket is
// reduce-scattered as soon as its gradients are final, and its reduction is
// finished one backward stage later (MPI progresses it only inside its
// calls), when the other ranks' blocks of it are zeroed and their pages
// handed back (zero_other_blocks): the gradients resident are this rank's
// blocks (1/dp) plus about two stages' (without overlap: all of them until
// the reductions after the backward). The next micro-batch
// accumulates into this rank's block (the sum so far) and into zeros
// elsewhere, so its reduce-scatter adds just its own gradients to the sum.
// A micro-batch that is not the step's last waits for its reductions before
// returning (they overlapped its backward). Under a pipeline (reduce_grads
// after the schedule) there is nothing to gain: the trainer refuses it.
//
// FSDP (cfg.shard = Full): as ZeRO-2, and the weights
// themselves sharded (sharded_weights.h): the buckets follow the stages, and
// every stage of every micro-batch (forward and backward, and forward_loss)
// gathers its unit just before it runs, prefetching the next, and releases it
// after.
//
// Overlap: the backward pass runs stage by stage through the Transformer's
// staged API (head, then each block from the last to the first, then the
// embeddings); after each stage the buckets whose gradients are now all final
// start their all-reduce, and the pending ones are polled so MPI progresses
// them while the next stage computes. Model code knows nothing of this.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "dist/communicator.h"
#include "model/transformer.h"
#include "parallel/ddp_config.h"
#include "parallel/grad_buckets.h"
#include "parallel/pipeline_parallel.h"
#include "parallel/sharded_weights.h"

namespace nk::parallel {

class DistributedDataParallel : public ChunkWeights {
 public:
  // `grads` reduces the gradients (the "dp-cp" group); both must outlive this.
  // Collective: broadcasts group rank 0's weights, so the replicas start equal
  // even if they were made differently. Only those with f32 masters: a frozen
  // base held without them (bf16 or NF4 under adapters) must be the same on
  // every rank already (train.init_from's, or drawn from the seed).
  // A model whose experts are split (Transformer::experts_split) also takes
  // the expert-data-parallel group (Megatron's "expert-dp": the ranks holding
  // the same experts), which reduces and broadcasts the experts' buckets, and
  // the "ep" group, over which the experts' part of the gradient norm sums.
  // ZeRO-1 shards the experts' buckets over the expert-dp group (each
  // rank's optimizer holds its block of its own experts' state) and the
  // rest over the dp group; so does FSDP with the weights themselves (each
  // expert tensor's blocks over the expert-dp ranks).
  DistributedDataParallel(Transformer& model, dist::Communicator& grads, const DdpConfig& cfg,
                          dist::Communicator* expert_grads = nullptr,
                          dist::Communicator* expert_norm = nullptr);

  // One micro-batch: forward, loss and backward, gradients ACCUMULATING
  // d(loss * grad_scale)/d params as Transformer::forward_backward does (bit
  // for bit the same local gradients). With `reduce` (the last micro-batch of
  // a step: earlier ones only accumulate) every bucket's all-reduce is started
  // by the time this returns; wait_grads() finishes them.
  float forward_backward(Activations& a, const Tensor& tokens, const Tensor& targets,
                         float grad_scale, bool reduce, const PackedBatchInfo* packed = nullptr);
  // The same with another loss (a TrainObjective's staged form): the
  // embedding and blocks run forward here, then `head` with the head's
  // weights resident: its forwards, its loss and its backward
  // (Transformer::head_row_backward or head_loss), leaving d loss / d residual
  // in a.dres; then the blocks' and embedding's backward here, starting the
  // bucket reductions as above. Returns what `head` returns.
  using HeadFn = std::function<double()>;
  double forward_backward(Activations& a, const Tensor& tokens, bool reduce, const HeadFn& head,
                          const PackedBatchInfo* packed = nullptr);
  // Without gradients: the forward, then `head` (forwards only).
  double forward_head(Activations& a, const Tensor& tokens, const HeadFn& head,
                      const PackedBatchInfo* packed = nullptr);
  // Without the staged passes (a pipeline stage runs its own schedule, then
  // this): starts every bucket's reduction at once; wait_grads() finishes them.
  void reduce_grads();
  // A pipeline chunk's units (ChunkWeights): FSDP gathers them all (the
  // embedding's, the layers', the head's) before it runs and releases them
  // after; nothing otherwise (ZeRO-1's gathers are finished before the
  // schedule).
  void use_chunk(int64_t first, int64_t last, bool embedding, bool head) override;
  void done_chunk(int64_t first, int64_t last, bool embedding, bool head) override;
  // Waits for every started bucket. Seconds spent waiting here and, under
  // ZeRO-1 and FSDP, for weight gathers in this step's forward and backward
  // passes: the exposed (not overlapped) communication of the step.
  double wait_grads();
  // After wait_grads(): the squared 2-norm of the step's summed gradient
  // (sharded: this rank's blocks, then summed over the group).
  double grad_norm_squared();

  // The same forward without gradients (validation), gathering as above.
  float forward_loss(Activations& a, const Tensor& tokens, const Tensor& targets,
                     const PackedBatchInfo* packed = nullptr);

  // Gradients reduce-scattered and optimizer state sharded (ZeRO-1, 2 or FSDP).
  bool sharded() const { return cfg_.shard != Shard::None; }
  // The gradients themselves sharded (ZeRO-2 and FSDP): other ranks' blocks
  // zeroed and handed back after each reduction.
  bool shards_grads() const { return cfg_.shard == Shard::Gradients || weights_; }
  // Zeroes the gradients before a step: the whole arena, or where they are
  // sharded this rank's blocks (the others are zero and stay not resident).
  void zero_grads();
  // Sharded gradients: the most bytes of the gradient arena resident at the
  // end of a backward stage since the last call (mincore; 0 otherwise).
  size_t take_grad_peak();
  // The weights sharded too (FSDP).
  bool shards_weights() const { return weights_ != nullptr; }
  // Each rank holds only its blocks of the f32 master weights (FSDP, and
  // ZeRO-1 with bf16 compute): checkpoints then hold the weights in pieces.
  bool shards_master() const { return master_sharded_; }
  // The buckets and the blocks this rank's optimizer updates: each bucket
  // whole without sharding, else its block of this rank (may be empty).
  std::vector<ShardPiece> optimizer_pieces() const;
  // ZeRO-1: starts all-gathering every bucket's updated weights (see above).
  // Nothing without sharding, and under FSDP (whose weights are gathered
  // stage by stage).
  void gather_params();
  // ZeRO-1: waits for every pending weight gather, so every rank holds the
  // whole model (before a checkpoint or the model export reads it).
  void finish_param_gathers();
  // The whole f32 master weights on every rank again where they are sharded
  // (the final model export; collective), and every pending gather finished.
  // A model whose f32 arena is released (a bf16 master the optimizer keeps)
  // has only the gathers finished.
  void gather_full_weights();

  // Blocking reductions of one host number over the group (the step's loss,
  // a stop request), identical on every rank after the call.
  double sum_over_group(double v);
  int max_over_group(int v);

  const std::vector<GradBucket>& buckets() const { return buckets_; }
  dist::Communicator& group() { return comm_; }
  // Split experts: the expert-dp group their buckets reduce over (else null).
  dist::Communicator* expert_group() const { return expert_grads_; }

 private:
  void launch_ready(int64_t stage);  // starts the buckets that become final at `stage`
  void launch_rest();                // starts every bucket not started yet (after the backward)
  // Before the stage `unit` runs: FSDP makes it resident, starting the gather
  // of `next` (-1: none); ZeRO-1 waits for the pending gathers of the buckets
  // it reads.
  void use(int64_t unit, int64_t next);
  void finish_param_gather(size_t bucket);  // ZeRO-1: waits for its weight gather
  void done(int64_t unit);                  // FSDP: releases `unit`
  void staged_forward(Activations& a, const Tensor& tokens, const PackedBatchInfo* packed);
  void poll();  // lets pending reductions progress (and releases the sharded gradients' done ones)
  // Sharded gradients: zeroes the other ranks' blocks of bucket k (its
  // reduction complete), once per reduction.
  void release_grads(size_t k);
  // Sharded gradients: waits for the reductions of buckets [0, n) and
  // releases them (the time counted as waited for).
  void finish_reductions(size_t n);
  void note_grad_resident();  // sharded gradients: updates grad_peak_
  // Every started reduction finished (sharded gradients: their other blocks
  // released); the time waited is added to grad_wait_s_.
  void finish_all_reductions();

  Transformer& model_;
  dist::Communicator& comm_;
  dist::Communicator* expert_grads_ = nullptr;  // "expert-dp" (split experts only)
  dist::Communicator* expert_norm_ = nullptr;   // "ep" (split experts only)
  // The group bucket b is reduced (and under ZeRO-1 sharded) over.
  dist::Communicator& group_of(const GradBucket& b) const {
    return b.experts && expert_grads_ ? *expert_grads_ : comm_;
  }
  DdpConfig cfg_;
  std::vector<GradBucket> buckets_;
  std::unique_ptr<ShardedWeights> weights_;  // FSDP only
  bool master_sharded_ = false;
  // ZeRO-1: per bucket its pending weight gather; per unit the buckets it reads.
  std::vector<dist::WorkPtr> param_gathers_;
  size_t params_pending_ = 0;
  std::vector<std::vector<size_t>> unit_buckets_;
  double param_wait_s_ = 0;             // waited for weight gathers since the last wait_grads
  std::vector<dist::WorkPtr> pending_;  // bucket k's reduction at index k
  std::vector<bool> grads_released_;    // per bucket: its reduction's other blocks zeroed
  double grad_wait_s_ = 0;              // waited for earlier micro-batches' reductions
  size_t grad_peak_ = 0;
  size_t next_bucket_ = 0;  // buckets are launched in order; the first not yet started
};

}  // namespace nk::parallel
