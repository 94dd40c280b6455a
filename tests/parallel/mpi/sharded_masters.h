// The exact f32 master weights of a whole model trained with the
// distributed optimizer or FSDP (parallel.shard): each rank's optimizer holds
// those of its own blocks only (the rest of masters_f32() is its bf16 copy,
// or stale), so the equivalence tests sum every rank's blocks together.
#pragma once
#include <cstring>

#include "dist/communicator.h"
#include "train/trainer.h"

namespace nk::test {

// Collective over `world` (every rank of the run) when the optimizer is
// sharded; the rank's own masters otherwise.
inline Tensor whole_masters(const Trainer& t, dist::Communicator& world) {
  const Tensor own = t.optimizer().masters_f32();
  bool sharded = false;
  for (const ParamGroup& g : t.optimizer().groups())
    sharded |= g.trainable && g.shard_size() != g.end - g.begin;
  if (!sharded) return own;
  Tensor out = Tensor::zeros({own.numel()}, DType::F32);
  for (const ParamGroup& g : t.optimizer().groups())
    if (g.trainable && g.shard_size() > 0)
      std::memcpy(out.data<float>() + g.shard_begin, own.data<float>() + g.shard_begin,
                  size_t(g.shard_size()) * 4);
  world.all_reduce(out);
  for (const ParamGroup& g : t.optimizer().groups())  // frozen: whole on every rank
    if (!g.trainable)
      std::memcpy(out.data<float>() + g.begin, own.data<float>() + g.begin,
                  size_t(g.end - g.begin) * 4);
  return out;
}

}  // namespace nk::test
