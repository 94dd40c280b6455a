#include "train/param_groups.h"

#include <algorithm>

#include "model/transformer.h"

namespace nk {

ParamArenas model_arenas(Transformer& model) {
  const bool copy = model.compute_params().raw() != model.params().raw();
  // The compute copy of the parameters with masters (a frozen base held
  // without them lies beyond, untouched by the optimizer).
  return {model.params(), model.grads(),
          copy ? model.compute_params().narrow0(0, model.params().numel()) : Tensor()};
}

std::vector<ParamGroup> default_param_groups(const ParamLayout& layout, double weight_decay,
                                             int64_t arena_end) {
  std::vector<ParamGroup> groups;
  auto add = [&](const char* name, int64_t begin, int64_t end, double wd, bool trainable) {
    if (end <= begin) return;
    ParamGroup g;
    g.name = name;
    g.begin = g.shard_begin = begin;
    g.end = g.shard_end = end;
    g.weight_decay = wd;
    g.trainable = trainable;
    groups.push_back(g);
  };
  add("decay", 0, layout.decay_end(), weight_decay, true);
  add("no_decay", layout.decay_end(), layout.trainable_end(), 0.0, true);
  add("frozen", layout.trainable_end(), arena_end < 0 ? layout.total() : arena_end, 0.0, false);
  return groups;
}

std::vector<ParamGroup> shard_param_groups(const std::vector<ParamGroup>& groups,
                                           const std::vector<parallel::ShardPiece>& pieces) {
  std::vector<ParamGroup> out;
  for (const ParamGroup& g : groups) {
    if (!g.trainable) {
      out.push_back(g);
      continue;
    }
    for (const parallel::ShardPiece& p : pieces) {
      const int64_t lo = std::max(g.begin, p.begin), hi = std::min(g.end, p.end);
      const int64_t own_lo = std::max(lo, p.own_begin), own_hi = std::min(hi, p.own_end);
      if (own_hi <= own_lo) continue;
      ParamGroup cut = g;
      cut.begin = lo;
      cut.end = hi;
      cut.shard_begin = own_lo;
      cut.shard_end = own_hi;
      out.push_back(cut);
    }
  }
  std::sort(out.begin(), out.end(),
            [](const ParamGroup& a, const ParamGroup& b) { return a.begin < b.begin; });
  return out;
}

}  // namespace nk
