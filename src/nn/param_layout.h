// The table of named parameter views over one flat buffer. Parameters,
// gradients, optimizer moments and the compute-dtype copy all share this
// layout, so each is one allocation and one pass for the optimizer,
// all-reduce buckets and checkpoints.
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"

namespace nk {

enum class Init { Normal, Zeros, Ones };

struct ParamInfo {
  std::string name;  // Hugging Face-like dotted name, e.g. "h.3.attn.qkv.weight"
  Shape shape;
  int64_t offset = 0;  // elements into the flat buffer (64-byte aligned)
  Init init = Init::Normal;
  float init_std = 0.f;
  bool decay = false;     // weight decay applies (matrices only)
  bool trainable = true;  // false: frozen, no gradient and no optimizer state
  int64_t numel() const { return shape_numel(shape); }
};

class ParamLayout {
 public:
  void add(const std::string& name, const Shape& shape, Init init, float init_std = 0.f);
  // Marks an added parameter frozen (before finalize; nk::Error if absent).
  void freeze(const std::string& name);
  // Orders decayed parameters (ndim >= 2) first and assigns offsets. After
  // this, [0, decay_end()) holds exactly the decayed trainable parameters,
  // [decay_end(), trainable_end()) the other trainable ones and
  // [trainable_end(), total()) the frozen ones, so gradients and optimizer
  // state are arenas of trainable_end() elements. params() keeps the order it
  // has with nothing frozen (an index there seeds a parameter's initial
  // values); only the offsets move frozen parameters to the end.
  void finalize();

  const std::vector<ParamInfo>& params() const { return params_; }
  const ParamInfo& find(const std::string& name) const;  // nk::Error if absent
  bool has(const std::string& name) const { return index_.count(name) > 0; }
  int64_t total() const { return total_; }
  int64_t decay_end() const { return decay_end_; }
  int64_t trainable_end() const { return trainable_end_; }
  int64_t count() const;  // elements actually used by parameters (no padding)

  // The view of `p` inside `flat` (a 1-d buffer of total() elements, any dtype).
  static Tensor view(const Tensor& flat, const ParamInfo& p);

 private:
  std::vector<ParamInfo> params_;
  std::unordered_map<std::string, size_t> index_;
  int64_t total_ = 0, decay_end_ = 0, trainable_end_ = 0;
  bool final_ = false;
};

}  // namespace nk
