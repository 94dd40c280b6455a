// The parallel.* keys that data parallelism owns (the mesh's own keys are
// dist's: dist/parallel_config.h). A recipe binds them with DdpConfig::bind
// beside dist::ParallelConfig::bind and checks them with check().
#pragma once
#include <cstdint>

#include "core/config_bind.h"

namespace nk::parallel {

// What data parallelism shards across the "dp-cp" group (parallel.shard).
enum class Shard {
  None,       // plain DDP: every rank holds weights, gradients and optimizer state whole
  Optimizer,  // ZeRO-1 (Megatron's distributed optimizer): gradients reduce-scattered,
              // each rank updates its shard of the buckets, the weights all-gathered
  Gradients,  // ZeRO-2 (PyTorch FSDP's SHARD_GRAD_OP): as Optimizer, and the
              // gradients sharded: every micro-batch's buckets reduce-scattered
              // as they become final, the other ranks' blocks then zeroed and
              // handed back, so each rank keeps 1/dp of them between buckets
  Full,       // FSDP / ZeRO-3: as Gradients, and the weights themselves sharded,
              // each stage's gathered just before it runs (sharded_weights.h)
};

struct DdpConfig {
  double bucket_mb = 25;  // MiB of f32 gradients per all-reduce message
  // true: each bucket's all-reduce starts as soon as the backward has written
  // its last gradient; false: all of them after the backward (for comparison).
  bool overlap_grad_reduce = true;
  Shard shard = Shard::None;
  int64_t bucket_elems() const;  // bucket_mb in f32 elements, at least 1

  void bind(ConfigBinder& b);
  void check() const;  // nk::Error naming the key for a value out of range
};

// The keys as a recipe reads them: bound from `config`, then checked.
DdpConfig ddp_config(const Config& config);

}  // namespace nk::parallel
