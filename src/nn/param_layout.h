// The table of named parameter views over one flat buffer. Parameters,
// gradients, optimizer moments and the compute-dtype copy all share this
// layout, so each is one allocation and one pass for the optimizer,
// all-reduce buckets and checkpoints.
//
// Each parameter also records what tensor parallelism and resharding
// checkpoints need to know about it: the fused parts it is made of along
// dimension 0 (QKV packed as [q | k | v], SwiGLU's up projection as
// [gate | up]) and the dimension it is split on across a tensor-parallel
// group (Megatron's layout: column-parallel weights and their biases on dim 0,
// row-parallel weights on dim 1, vocabulary-parallel embeddings on dim 0,
// norms and row-parallel biases replicated).
#pragma once
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"

namespace nk {

// Normal: N(0, init_std^2); Uniform: U(-init_std, init_std) (LoRA's A, as
// PyTorch's default Linear init).
enum class Init { Normal, Uniform, Zeros, Ones };

// How a parameter is divided over a tensor-parallel group of size n.
enum class Split {
  Replicated,  // every rank holds all of it
  Rows,        // dim 0: column-parallel weight/bias, vocabulary-parallel embedding
  Cols,        // dim 1: row-parallel weight
  // dim 0 in n contiguous blocks of whole fused parts (a MoE layer's experts
  // over the expert-parallel group: rank r holds experts [r E/n, (r+1) E/n));
  // over the tensor-parallel group each expert is split as its
  // ParamInfo::expert_split says (tensor_split)
  Experts,
};
const char* split_name(Split s);  // "replicated", "rows", "cols"

// One fused part of a parameter: rows [row0, row0 + rows) of dim 0.
struct ParamPart {
  std::string name;  // "q", "k", "v", "gate", "up"
  int64_t row0 = 0, rows = 0;
};

struct ParamInfo {
  std::string name;  // Hugging Face-like dotted name, e.g. "h.3.attn.qkv.weight"
  Shape shape;
  int64_t offset = 0;  // elements into the flat buffer (64-byte aligned)
  Init init = Init::Normal;
  float init_std = 0.f;
  bool decay = false;     // weight decay applies (matrices only)
  bool trainable = true;  // false: frozen, no gradient and no optimizer state
  Split split = Split::Replicated;
  // Fused parts along dim 0, in order and covering it; empty: one plain tensor.
  // A split on dim 0 divides every part separately (rank r holds the r-th
  // share of q, of k and of v), so the heads stay whole on each rank.
  std::vector<ParamPart> parts;
  bool adapter = false;  // a PEFT adapter's (LoRA, IA3), not the base model's
  // An expert tensor's (Split::Experts) split of every expert over the
  // (expert) tensor-parallel group, Megatron's expert tensor parallelism:
  // Rows (each fused part's rows: the experts' gate | up, column-parallel),
  // Cols (the experts' down, row-parallel) or Replicated (whole experts).
  Split expert_split = Split::Replicated;
  // Split over fewer ranks than the tensor-parallel group (a MoE block's
  // tensors under 1 < parallel.etp < parallel.tp: expert tensor parallelism
  // narrower than the attention's): 0, over all n of them; else over
  // tp_ways of them, n-way rank r holding share r mod tp_ways (the expert-tp
  // groups are runs of consecutive tp ranks), each share on n / tp_ways
  // ranks. Not applied to the expert-parallel split (Split::Experts).
  int64_t tp_ways = 0;
  // Vocabulary padding (the embedding and head, Split::Rows, no parts): under
  // n > 1-way splitting dim 0 is padded with zero rows to a multiple of
  // pad_multiple x n (Megatron's make_vocab_size_divisible_by), so every rank
  // holds padded_rows / n rows; the last ranks' shards end in (or are all)
  // padding. The padding is in no whole value: shard_ranges never name it,
  // extract_shard zeroes it, checkpoints and exports hold shape[0] rows. 0:
  // not padded (n must divide the rows).
  int64_t pad_multiple = 0;
  // Frozen and stored quantised (QLoRA's NF4), outside the flat buffers: its
  // offset is past dense_end() and no flat buffer holds it.
  bool quantized = false;
  int64_t numel() const { return shape_numel(shape); }
  const ParamPart& part(const std::string& name) const;  // nk::Error if absent
};

// Options of ParamLayout::add beyond name, shape and initialisation.
struct ParamOptions {
  Split split = Split::Replicated;
  // (name, rows) of each fused part along dim 0; the rows must sum to shape[0].
  std::vector<std::pair<std::string, int64_t>> parts;
  bool adapter = false;                    // see ParamInfo::adapter
  int64_t pad_multiple = 0;                // see ParamInfo::pad_multiple
  Split expert_split = Split::Replicated;  // see ParamInfo::expert_split
  int64_t tp_ways = 0;                     // see ParamInfo::tp_ways
};

// Rows of a parameter of `rows` rows padded for n-way splitting to a
// multiple of `multiple` x n (ParamInfo::pad_multiple); `rows` itself when
// n = 1 or multiple = 0. One process never pads: its runs, checkpoints and
// exports stay what they were.
int64_t padded_rows(int64_t rows, int64_t multiple, int64_t n);

// The options `p` was added with (to copy it into another layout).
ParamOptions param_options(const ParamInfo& p);

// p as the tensor-parallel group splits it: an expert tensor (Split::Experts)
// with its expert_split in place of the expert-parallel split (its fused
// parts, each an expert's, split one by one); any other parameter as it is.
// The functions below split a Split::Experts parameter over the
// expert-parallel group: pass them tensor_split(p) for the tensor-parallel one.
ParamInfo tensor_split(const ParamInfo& p);

// A contiguous block of rows/columns of one parameter: [start, start + len)
// along `dim` of its global shape, stored at [local_start, local_start + len)
// of the same dim in a rank's shard.
struct SliceRange {
  int dim = 0;
  int64_t start = 0, len = 0, local_start = 0;
};

// "rank r of n of part k of tensor t": the global ranges a shard holds. part
// = "" for the whole parameter (every part's share, in order, for a fused
// one). n = 1 gives the whole parameter (or part) as one range. nk::Error if
// the split does not divide the parameter (or each part) evenly. A padded
// parameter's rank holds [r s, r s + s) of the padded rows, s = padded / n:
// the range is cut at shape[0] (empty, no range at all, for a rank holding
// padding only).
std::vector<SliceRange> shard_ranges(const ParamInfo& p, int64_t rank, int64_t n,
                                     const std::string& part = "");
// The shape of rank r's shard of `p` (of `part`) under n-way splitting.
Shape shard_shape(const ParamInfo& p, int64_t n, const std::string& part = "");
// Host copies between a parameter's whole value (p's global shape, row-major,
// `elem` bytes per element) and rank r's shard of it under n-way splitting
// (shard_shape, row-major): a tensor-parallel rank's initial values and
// loads (extract, which zeroes the shard's padding rows), a gather for
// checkpoints and exports (insert, which drops them).
void extract_shard(const ParamInfo& p, int64_t rank, int64_t n, size_t elem, const void* whole,
                   void* shard);
void insert_shard(const ParamInfo& p, int64_t rank, int64_t n, size_t elem, const void* shard,
                  void* whole);

class ParamLayout {
 public:
  void add(const std::string& name, const Shape& shape, Init init, float init_std = 0.f,
           const ParamOptions& opt = {});
  // Marks an added parameter frozen (before finalize; nk::Error if absent).
  void freeze(const std::string& name);
  // Marks an added frozen parameter as stored quantised (before finalize;
  // nk::Error if absent, InternalError if trainable).
  void quantize(const std::string& name);
  // Orders decayed parameters (ndim >= 2) first and assigns offsets. After
  // this, [0, decay_end()) holds exactly the decayed trainable parameters,
  // [decay_end(), trainable_end()) the other trainable ones and
  // [trainable_end(), total()) the frozen ones, so gradients and optimizer
  // state are arenas of trainable_end() elements; the quantised ones come
  // last of all, from dense_end(), so flat buffers in a dtype stop there. params() keeps the order
  // it has with nothing frozen (an index there seeds a parameter's initial values); only the
  // offsets move frozen parameters to the end.
  void finalize();

  const std::vector<ParamInfo>& params() const { return params_; }
  const ParamInfo& find(const std::string& name) const;  // nk::Error if absent
  bool has(const std::string& name) const { return index_.count(name) > 0; }
  int64_t total() const { return total_; }
  int64_t decay_end() const { return decay_end_; }
  int64_t trainable_end() const { return trainable_end_; }
  int64_t dense_end() const { return dense_end_; }  // total() when nothing is quantised
  int64_t count() const;  // elements actually used by parameters (no padding)

  // The layout of one rank's shards under n-way tensor parallelism (of a
  // finalized layout): every parameter at its shard_shape (of tensor_split:
  // expert tensors keep every expert, each at its share), each fused part at
  // its share, in the same order with the same trainable and quantised
  // flags. nk::Error naming the parameter when n does not divide it.
  ParamLayout shard(int64_t n) const;
  // The layout of one rank's parameters under n-way expert parallelism: the
  // Split::Experts parameters at their shard_shape (without fused parts: a
  // rank's parts are other experts than another's), the rest whole.
  ParamLayout shard_experts(int64_t n) const;
  // The same layout (offsets, flags) with the parameters `which` accepts
  // whole on every tensor-parallel rank: split Replicated, or for an expert
  // tensor (Split::Experts, still split over the expert-parallel group)
  // expert_split Replicated (parallel.etp = 1 under parallel.tp > 1).
  ParamLayout replicated(const std::function<bool(const ParamInfo&)>& which) const;
  // The same layout with the parameters `which` accepts split over `ways`
  // of the tensor-parallel ranks (ParamInfo::tp_ways: 1 < parallel.etp <
  // parallel.tp, the MoE blocks' tensors).
  ParamLayout split_over(const std::function<bool(const ParamInfo&)>& which, int64_t ways) const;
  // The parameters `keep` accepts (a pipeline stage's), in the same order
  // with the same flags, laid out afresh (of a finalized layout).
  ParamLayout subset(const std::function<bool(const ParamInfo&)>& keep) const;

  // The view of `p` inside `flat` (a 1-d buffer of total() elements, any dtype).
  static Tensor view(const Tensor& flat, const ParamInfo& p);
  // The rows of fused part `part` of `p` inside `flat`.
  static Tensor part_view(const Tensor& flat, const ParamInfo& p, const std::string& part);

 private:
  std::vector<ParamInfo> params_;
  std::unordered_map<std::string, size_t> index_;
  int64_t total_ = 0, decay_end_ = 0, trainable_end_ = 0, dense_end_ = 0;
  bool final_ = false;
};

}  // namespace nk
