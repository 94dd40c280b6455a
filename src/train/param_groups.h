// Parameter groups: ranges of the flat parameter arenas (nn/param_layout.h)
// that an optimizer updates with one setting each, as PyTorch's param_groups
// and Megatron's decay / no-decay / lr-multiplier groups. A group may be
// frozen (no gradient, no state), and this process may own only a shard of a
// group's optimizer state (ZeRO); one process owns every group whole.
#pragma once
#include <string>
#include <vector>

#include "nn/param_layout.h"
#include "parallel/grad_buckets.h"

namespace nk {

class Transformer;

// The flat buffers an optimizer works on. Gradients exist for the trainable
// parameters only, which the layout puts first.
struct ParamArenas {
  Tensor params;   // f32 [layout total] master weights
  Tensor grads;    // f32 [layout trainable_end]
  Tensor compute;  // the weights the kernels read, rewritten by each update;
                   // undefined when they are `params` itself (f32 compute)
};
ParamArenas model_arenas(Transformer& model);

struct ParamGroup {
  std::string name;            // for messages: "decay", "no_decay", "frozen"
  int64_t begin = 0, end = 0;  // elements [begin, end) of the arenas
  double lr_scale = 1.0;       // multiplies the schedule's learning rate
  double weight_decay = 0.0;   // decoupled (AdamW) weight decay
  bool trainable = true;       // false: no gradient, no optimizer state, never updated
  // [shard_begin, shard_end) within [begin, end): the part whose optimizer
  // state this process holds and updates. The whole group at one process; a
  // distributed optimizer sets each rank's shard.
  int64_t shard_begin = 0, shard_end = 0;
  int64_t shard_size() const { return shard_end - shard_begin; }
};

// The groups every run uses today, in arena order: trainable matrices with
// `weight_decay`, trainable vectors (norms, biases) without, then the frozen
// parameters, if any, up to `arena_end` (-1: layout.total(); a model whose
// frozen base has no f32 masters has an arena that stops sooner, see
// Transformer::params). Empty groups are left out; each is owned whole.
std::vector<ParamGroup> default_param_groups(const ParamLayout& layout, double weight_decay,
                                             int64_t arena_end = -1);

// `groups` for a distributed optimizer (ZeRO-1; pieces: parallel/grad_buckets.h): every trainable
// group cut at the pieces' boundaries (a bucket never straddles two groups' settings: it lies in
// one group or is cut), each cut owning its piece's own range within it; cuts whose owned part is
// empty are left out, frozen groups kept whole. The result is sorted by begin, so the state is laid
// out in arena order.
std::vector<ParamGroup> shard_param_groups(const std::vector<ParamGroup>& groups,
                                           const std::vector<parallel::ShardPiece>& pieces);

}  // namespace nk
