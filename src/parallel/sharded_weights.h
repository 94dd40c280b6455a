// FSDP's weights (parallel.shard=full, ZeRO-3): the model keeps its flat
// weight arenas as address space, but between uses only this rank's block of
// every gradient bucket (grad_buckets.h: shard_counts) is resident. A unit,
// the buckets one stage of the step reads, is all-gathered into place just
// before the stage runs and released after it: madvise(MADV_DONTNEED) hands
// the pages of the other ranks' blocks back to the OS (they read as zeros
// until the next gather), so the resident weights fall to about 1/dp plus the
// unit in use and the one prefetched. The same would be done on a GPU by
// mapping and unmapping physical pages of a reserved range (CUDA virtual
// memory management).
//
// What is gathered is the compute-dtype arena (bf16 or f32), which the
// kernels read. With bf16 compute the f32 master weights outside this rank's
// blocks are released once and never touched again: the optimizer updates
// only this rank's blocks, and checkpoints hold each rank's blocks. Frozen
// parameters have no bucket and stay whole on every rank.
#pragma once
#include <cstdint>
#include <vector>

#include "dist/communicator.h"
#include "model/transformer.h"
#include "parallel/grad_buckets.h"

namespace nk::parallel {

// Bytes of `t`'s memory that are resident (mincore), for the memory report.
size_t resident_bytes(const Tensor& t);
// Asks for transparent huge pages (2 MiB) under a host arena whose blocks are
// handed back and faulted in again every micro-batch (ZeRO-2's and FSDP's
// gradients, FSDP's weights): a huge page faults and zeroes 512 small pages'
// bytes at once (on the Zen 5 VM a released byte written again cost 0.07 ns
// past a resident one, against 0.57 ns in small pages). Advice only: a
// kernel without THP, or with it off, leaves small pages; a release of part of
// a huge page splits it. No-op for device memory.
void advise_huge_pages(const Tensor& arena);
// Hands the pages of the other ranks' blocks of bucket `b` of `arena` back to
// the OS (whole pages inside those blocks only, so a page shared with this
// rank's block keeps its bytes); they read as zeros until written again.
void release_other_blocks(const Tensor& arena, const GradBucket& b, const dist::Communicator& comm);
// Sets the other ranks' blocks of bucket `b` of `arena` to zero and leaves
// them not resident where they are whole pages (ZeRO-2's and FSDP's gradients
// after their reduction: the next micro-batch accumulates into zeros there).
// On a device: filled with zeros.
void zero_other_blocks(const Tensor& arena, const GradBucket& b, const dist::Communicator& comm);
// All-gathers every bucket's blocks of the f32 master weights (collective) and
// refreshes the compute copy: the whole model on every rank again.
// Split experts: their buckets over `experts` (the expert-dp group) instead.
void gather_master(Transformer& model, dist::Communicator& comm,
                   const std::vector<GradBucket>& buckets, dist::Communicator* experts = nullptr);

class ShardedWeights {
 public:
  // `buckets` must be stage-aligned (plan_grad_buckets(..., true)). Releases
  // every other rank's blocks. model and comm must outlive this. Split
  // experts (Transformer::experts_split): their buckets are sharded over
  // `experts` (the expert-dp group, the ranks holding the same experts)
  // instead of comm.
  ShardedWeights(Transformer& model, dist::Communicator& comm, std::vector<GradBucket> buckets,
                 dist::Communicator* experts = nullptr);

  // A unit is a stage (grad_buckets.h: embed_stage, block_stage, kHeadStage)
  // and the buckets it reads (stage_buckets).
  // Starts gathering `unit` (nothing if it is resident or on its way).
  void prefetch(int64_t unit);
  // Makes `unit` resident (waits for its prefetch, or gathers it now).
  void gather(int64_t unit);
  // Releases the other ranks' blocks of `unit`.
  void release(int64_t unit);
  // The whole f32 master and compute weights on every rank (the final model
  // export); they stay resident. A bf16 master the optimizer keeps (the f32
  // arena released): the compute weights alone, its bf16 part.
  void gather_all_master();

  const std::vector<GradBucket>& buckets() const { return buckets_; }

 private:
  Transformer& model_;
  dist::Communicator& comm_;
  dist::Communicator* experts_;  // split experts' buckets (null: comm_ for every bucket)
  std::vector<GradBucket> buckets_;
  std::vector<std::vector<size_t>> units_;  // per stage: the buckets it reads
  enum class State { Released, Pending, Resident };
  std::vector<State> state_;         // per bucket
  std::vector<dist::WorkPtr> work_;  // per bucket: its pending gather
  void start_gather(size_t k);       // bucket k's compute weights, if released
  // The group bucket b is sharded over.
  dist::Communicator& group(const GradBucket& b) const {
    return b.experts && experts_ ? *experts_ : comm_;
  }
};

}  // namespace nk::parallel
