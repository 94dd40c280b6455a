#include "train/param_groups.h"

#include "model/transformer.h"

namespace nk {

ParamArenas model_arenas(Transformer& model) {
  const bool copy = model.compute_params().raw() != model.params().raw();
  return {model.params(), model.grads(), copy ? model.compute_params() : Tensor()};
}

std::vector<ParamGroup> default_param_groups(const ParamLayout& layout, double weight_decay) {
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
  add("frozen", layout.trainable_end(), layout.total(), 0.0, false);
  return groups;
}

}  // namespace nk
