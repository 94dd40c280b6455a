// What a tensor- or pipeline-parallel run needs around the model once per
// step or save (the layers' own communication is in nn/tensor_parallel.h
// and parallel/pipeline_parallel.h): the gradient norm over the model's
// pieces, the sequence-parallel gradients summed, and the pieces gathered
// into the whole model for checkpoints and exports.
#pragma once
#include "model/transformer.h"

namespace nk::parallel {

// Whether this process counts p in whole-model sums (the norm, a gather):
// each tensor-parallel shard counts, a parameter replicated over tp on tp
// rank 0 only, one split over etp < tp ranks (ParamInfo::tp_ways) on the
// first etp tp ranks only, and a tied token table on the first pipeline
// stage only (the last stage's is a copy).
bool owns(const Transformer& model, const ParamInfo& p);

// The sum of squares of `grads` (model.grads() or the same layout) over
// the elements [begin, end) of the parameters this process owns.
double owned_sum_squares(const Transformer& model, const Tensor& grads, int64_t begin, int64_t end);

// Squared 2-norm of the whole model's gradient in `grads`: this process's
// owned parameters, summed over `model_parallel` (the mesh's "tp-pp" group;
// null: one process holds the model, and this is ops::sum_squares(grads)).
// A distributed optimizer's rank counts only its blocks, `owned` (ranges of
// the arena), and sums over `data_parallel` first. Split experts
// (Transformer::experts_split, without `owned`): the experts' tensors are
// summed over the ep group too (each of its ranks holds other experts).
// Collective.
double model_parallel_grad_norm_squared(
    const Transformer& model, const Tensor& grads, dist::Communicator* model_parallel,
    const std::vector<std::pair<int64_t, int64_t>>* owned = nullptr,
    dist::Communicator* data_parallel = nullptr);

// Sums the gradients over the data-parallel replicas after a pipelined step
// (`dense`: the mesh's "dp-cp" group): every parameter's over `dense`, or,
// with split experts (Transformer::experts_split), the experts' tensors over
// `experts` (the "expert-dp" group: the ranks holding the same experts;
// null or a group of one: nothing to sum) and the rest over `dense`.
// Collective.
void reduce_replica_grads(Transformer& model, dist::Communicator& dense,
                          dist::Communicator* experts);

// Adds model.tensor_parallel_partial_grads() over the tp group (each rank
// holds its rows' or heads' part of them), and model.token_split_partial_grads()
// over the "expert-token" group (1 < parallel.etp < tp). Once per step,
// after the backward; nothing without tensor parallelism. Collective.
void reduce_tensor_parallel_partial_grads(const Transformer& model);

// The whole model's values of a flat f32 arena that tensor and pipeline
// parallelism split: `local` laid out by model.layout() (all of it, or its
// trainable parameters: the optimizer moments) is gathered over the tp
// group, then summed over `pp` (the pipeline group, each stage adding the
// parameters it owns; null: no pipeline), into a new tensor laid out by
// model.global_layout() (total() or trainable_end() elements), on every
// rank. Collective.
// Split experts (Transformer::experts_split): first over the ep group, the
// experts' tensors put together from every rank's rows (into the layout of
// model.unsplit_layout()), the rest taken from ep rank 0's (equal on every
// rank); then over tp as above (each expert from its tp shares).
Tensor gather_model(const Transformer& model, const Tensor& local, dist::Communicator* pp);

// The inverse of the experts' split: this rank's arena (model.layout(): all
// of it, or its trainable parameters) of a host f32 arena laid out by
// model.unsplit_layout() (a resumed checkpoint's optimizer moments, read
// as this stage's tensor-parallel shards). Other models: the same values.
// Not collective.
Tensor local_arena(const Transformer& model, const Tensor& unsplit);

}  // namespace nk::parallel
