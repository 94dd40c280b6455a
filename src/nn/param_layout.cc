#include "nn/param_layout.h"

#include <algorithm>

namespace nk {

void ParamLayout::add(const std::string& name, const Shape& shape, Init init, float init_std) {
  NK_CHECK(!final_, "add after finalize");
  NK_CHECK(!index_.count(name), "duplicate parameter {}", name);
  ParamInfo p;
  p.name = name;
  p.shape = shape;
  p.init = init;
  p.init_std = init_std;
  p.decay = shape.size() >= 2;
  index_[name] = params_.size();
  params_.push_back(p);
}

void ParamLayout::freeze(const std::string& name) {
  NK_CHECK(!final_, "freeze after finalize");
  auto it = index_.find(name);
  if (it == index_.end()) fail("no parameter named '{}' to freeze", name);
  params_[it->second].trainable = false;
}

void ParamLayout::finalize() {
  std::stable_partition(params_.begin(), params_.end(), [](const ParamInfo& p) { return p.decay; });
  for (size_t i = 0; i < params_.size(); ++i) index_[params_[i].name] = i;
  // Trainable parameters first (decayed, then not), frozen ones last: with
  // nothing frozen this is one pass in params_ order.
  int64_t off = 0;
  for (bool trainable : {true, false}) {
    for (auto& p : params_) {
      if (p.trainable != trainable) continue;
      p.offset = off;
      off += (p.numel() + 15) / 16 * 16;  // keep every view 64-byte aligned in f32
      if (trainable && p.decay) decay_end_ = off;
      if (trainable) trainable_end_ = off;
    }
  }
  total_ = off;
  final_ = true;
}

const ParamInfo& ParamLayout::find(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) fail("no parameter named '{}'", name);
  return params_[it->second];
}

int64_t ParamLayout::count() const {
  int64_t n = 0;
  for (auto& p : params_) n += p.numel();
  return n;
}

Tensor ParamLayout::view(const Tensor& flat, const ParamInfo& p) {
  return flat.narrow0(p.offset, p.numel()).view(p.shape);
}

}  // namespace nk
