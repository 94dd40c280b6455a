// Gradient buckets for data parallelism: the flat f32 gradient arena
// (Transformer::grads(), [layout.trainable_end()] elements) cut into contiguous
// ranges, each all-reduced as one message as soon as the backward pass has
// written its last gradient (PyTorch DDP's and Megatron-Core's buckets).
//
// The arena is laid out by ParamLayout, decayed matrices first, then the other
// trainable parameters (norms, biases), each region in model order (embeddings,
// h.0 ... h.L-1, final norm, head). A bucket never straddles the two regions:
// each region is walked from its end towards its start (so roughly from the
// last layer to the first, the order the backward produces gradients), whole
// parameters are added until a bucket holds at least `bucket_elems` elements,
// and then it is cut. A parameter larger than that is a bucket of its own;
// parameters are never split. A bucket holds experts' parameters
// (Split::Experts: under expert parallelism they are reduced over the
// expert-data-parallel group) or none. Buckets tile [0, trainable_end) exactly: padding
// between parameters belongs to the bucket of the parameter before it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "nn/param_layout.h"

namespace nk::parallel {

// Where in the backward pass a parameter's gradient becomes final, counted in
// backward order: 0 after the head and final norm (head_loss), 1 + (L-1-l)
// after block l (blocks_backward of layer l), L + 1 after the embeddings
// (embed_backward; a tied embedding also gets the head's gradient, so it is
// final only here). Read from the layout's model order: the parameters before
// the first "h.N." one are the embeddings, the ones after the last are the head,
// except p-tuning's "prompt.*" (laid out last): the embeddings' stage.
std::vector<int64_t> grad_ready_stages(const ParamLayout& layout, int64_t n_layer);
inline int64_t num_backward_stages(int64_t n_layer) {
  return n_layer + 2;
}
// The stage numbers by name (forward order: embeddings, block 0 .. L-1, head).
inline int64_t embed_stage(int64_t n_layer) {
  return n_layer + 1;
}
inline int64_t block_stage(int64_t n_layer, int64_t l) {
  return 1 + (n_layer - 1 - l);
}
constexpr int64_t kHeadStage = 0;

struct GradBucket {
  int64_t begin = 0, end = 0;  // elements [begin, end) of the gradient arena
  int64_t ready_stage = 0;     // max of its parameters' grad_ready_stages
  bool experts = false;        // its parameters are MoE experts' (Split::Experts), or none are
  std::vector<size_t> params;  // indices into layout.params(), by descending offset
  int64_t numel() const { return end - begin; }
};

// The buckets in launch order: by ready stage, then by descending offset
// (each region's last bucket first). Frozen parameters have no gradient and no
// bucket. bucket_elems >= 1. stage_aligned (FSDP, whose units of weights are
// the stages): a bucket also ends where the ready stage changes, so each
// bucket holds the parameters of one stage only.
std::vector<GradBucket> plan_grad_buckets(const ParamLayout& layout, int64_t n_layer,
                                          int64_t bucket_elems, bool stage_aligned = false);

// One piece of a distributed optimizer's plan: arena range [begin, end) (a
// gradient bucket) of which one rank holds the state of [own_begin, own_end).
struct ShardPiece {
  int64_t begin = 0, end = 0, own_begin = 0, own_end = 0;
};

// For each stage, the buckets (indices, ascending) holding a parameter that
// the stage's forward reads: its own, and for the head of a model with tied
// embeddings also the embeddings'. Weight gathers (ZeRO-1, FSDP) wait for or
// fetch exactly these before the stage runs.
std::vector<std::vector<size_t>> stage_buckets(const ParamLayout& layout, int64_t n_layer,
                                               bool tied_embeddings,
                                               const std::vector<GradBucket>& buckets);

// The distributed optimizer's shards (Megatron's): each bucket is cut into n
// blocks, rank j's [begin + floor(j·len/n), begin + floor((j+1)·len/n)), so
// a bucket's reduce-scatter and all-gather move blocks that differ by at most
// one element. shard_counts gives the n block lengths (communicator counts).
std::vector<int64_t> shard_counts(const GradBucket& b, int64_t n);
// Every bucket with rank `rank`'s block of it (of n), in bucket (launch) order.
std::vector<ShardPiece> owned_shards(const std::vector<GradBucket>& buckets, int64_t n,
                                     int64_t rank);

// "12 buckets over 1.23M gradients (4.7 MiB), largest 0.61 MiB".
std::string describe_buckets(const std::vector<GradBucket>& buckets);

}  // namespace nk::parallel
