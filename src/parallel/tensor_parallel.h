// What a tensor-parallel run needs around the model once per step or save
// (the layers' own communication is in nn/tensor_parallel.h): the gradient
// norm over the group, the sequence-parallel gradients summed, and the
// shards gathered into the whole model for checkpoints and exports.
#pragma once
#include "model/transformer.h"

namespace nk::parallel {

// Squared 2-norm of the whole model's gradient in `grads` (model.grads()
// or the same layout): each rank's sharded parameters, plus the replicated
// ones counted once (on tp rank 0), summed over the tp group. Collective.
// Without tensor parallelism, ops::sum_squares(grads).
double tensor_parallel_grad_norm_squared(const Transformer& model, const Tensor& grads);

// Adds model.sequence_parallel_grads() over the tp group (each rank holds
// its rows' part of them). Once per step, after the backward; nothing
// without sequence parallelism. Collective.
void reduce_sequence_parallel_grads(const Transformer& model);

// The whole model's values of a flat f32 arena that tensor parallelism
// shards: `local` laid out by model.layout() (all of it, or its trainable
// parameters: the optimizer moments) is gathered over the tp group and
// reassembled by model.global_layout() into a new tensor of
// global_layout().total() (or trainable_end()) elements, on every rank.
// Collective.
Tensor gather_tensor_parallel(const Transformer& model, const Tensor& local);

}  // namespace nk::parallel
