#include "parallel/model_parallel.h"

#include <algorithm>
#include <optional>

#include "ops/ops.h"

namespace nk::parallel {

bool owns(const Transformer& model, const ParamInfo& p) {
  if (p.split == Split::Replicated && model.tensor_parallel().rank() != 0) return false;
  return !(p.name == "wte" && !model.stage().embedding);
}

namespace {
// owned_sum_squares of the experts' tensors (experts true) or of the rest.
double owned_sum_squares_of(const Transformer& model, const Tensor& grads, int64_t begin,
                            int64_t end, std::optional<bool> experts) {
  double sum = 0;
  for (const ParamInfo& p : model.layout().params()) {
    const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel());
    if (experts && *experts != (p.split == Split::Experts)) continue;
    if (p.trainable && hi > lo && owns(model, p))
      sum += ops::sum_squares(grads.narrow0(lo, hi - lo));
  }
  return sum;
}
}  // namespace

double owned_sum_squares(const Transformer& model, const Tensor& grads, int64_t begin,
                         int64_t end) {
  return owned_sum_squares_of(model, grads, begin, end, std::nullopt);
}

void reduce_replica_grads(Transformer& model, dist::Communicator& dense,
                          dist::Communicator* experts) {
  const Tensor grads = model.grads();
  if (!model.experts_split()) return dense.all_reduce(grads);
  // Runs of neighbouring trainable parameters of one kind, one all-reduce each.
  int64_t begin = 0, end = 0;
  bool kind = false;
  auto flush = [&] {
    if (end > begin) {
      dist::Communicator* c = kind ? experts : &dense;
      if (c && c->size() > 1) c->all_reduce(grads.narrow0(begin, end - begin));
    }
    begin = end;
  };
  std::vector<const ParamInfo*> ps;
  for (const ParamInfo& p : model.layout().params())
    if (p.trainable) ps.push_back(&p);
  std::sort(ps.begin(), ps.end(),
            [](const ParamInfo* a, const ParamInfo* b) { return a->offset < b->offset; });
  for (const ParamInfo* p : ps) {
    const bool e = p->split == Split::Experts;
    if (e != kind || p->offset != end) {
      flush();
      begin = end = p->offset;
      kind = e;
    }
    end = p->offset + p->numel();
  }
  flush();
}

double model_parallel_grad_norm_squared(const Transformer& model, const Tensor& grads,
                                        dist::Communicator* model_parallel,
                                        const std::vector<std::pair<int64_t, int64_t>>* owned,
                                        dist::Communicator* data_parallel) {
  if (!owned && (!model_parallel || model_parallel->size() == 1)) return ops::sum_squares(grads);
  Tensor sum = Tensor::zeros({1}, DType::F64);
  if (!owned && model.experts_split()) {
    // Every ep rank's experts, each rank's share of the rest.
    Tensor experts = Tensor::zeros({1}, DType::F64);
    *experts.data<double>() = owned_sum_squares_of(model, grads, 0, grads.numel(), true);
    model.expert_parallel().comm->all_reduce(experts);
    *sum.data<double>() =
        owned_sum_squares_of(model, grads, 0, grads.numel(), false) + *experts.data<double>();
  } else if (owned)
    for (const auto& [begin, end] : *owned)
      *sum.data<double>() += owned_sum_squares(model, grads, begin, end);
  else
    *sum.data<double>() = owned_sum_squares(model, grads, 0, grads.numel());
  if (data_parallel) data_parallel->all_reduce(sum);
  if (model_parallel) model_parallel->all_reduce(sum);
  return *sum.data<double>();
}

void reduce_sequence_parallel_grads(const Transformer& model) {
  for (const Tensor& g : model.sequence_parallel_grads())
    model.tensor_parallel().comm->all_reduce(g);
}

Tensor gather_model(const Transformer& model, const Tensor& local, dist::Communicator* pp) {
  const ParamLayout &mine = model.layout(), &whole = model.global_layout();
  bool all = local.numel() == mine.total();
  NK_CHECK(local.dtype() == DType::F32 && (all || local.numel() == mine.trainable_end()),
           "gather_model: {} is not an arena of the model's layout", local.desc());
  // A stage without frozen parameters cannot tell the two apart: the stages
  // agree (the whole model's frozen ones are on some stage).
  if (pp && pp->size() > 1) {
    Tensor says = Tensor::zeros({2}, DType::I32);  // [surely all, surely trainable]
    const bool plain = mine.total() == mine.trainable_end();
    says.data<int32_t>()[0] = all && !plain;
    says.data<int32_t>()[1] = !all && !plain;
    pp->all_reduce(says, dist::ReduceOp::Max);
    NK_CHECK(!(says.data<int32_t>()[0] && says.data<int32_t>()[1]),
             "gather_model: the pipeline stages pass arenas of different kinds");
    if (says.data<int32_t>()[0] || says.data<int32_t>()[1]) all = says.data<int32_t>()[0] != 0;
  }
  const nn::TensorParallel& tp = model.tensor_parallel();
  // The group whose pieces make the whole: tp, or ep for split experts (a
  // MoE model has no tensor parallelism), where only the experts are pieces.
  const bool experts = model.experts_split();
  dist::Communicator* comm = experts ? model.expert_parallel().comm : tp.comm;
  const int64_t n = experts ? model.expert_parallel().size() : tp.size();
  Tensor out = Tensor::zeros({all ? whole.total() : whole.trainable_end()}, DType::F32);
  Tensor host = local;
  if (local.device() != kHost) {
    host = Tensor::empty(local.shape(), DType::F32);
    ops::copy_to_host(local, host.data<float>());
  }
  Tensor gathered = host;
  if (n > 1) {
    gathered = Tensor::empty({n * host.numel()}, DType::F32);
    comm->all_gather(host, gathered);
  }
  const bool pipelined = pp && pp->size() > 1;
  for (const ParamInfo& p : whole.params()) {
    if ((!all && !p.trainable) || !mine.has(p.name)) continue;
    const ParamInfo& q = mine.find(p.name);
    if (pipelined && p.name == "wte" && !model.stage().embedding) continue;  // the tied copy
    const int64_t ways = experts && p.split != Split::Experts ? 1 : n;       // the rest: rank 0's
    for (int64_t r = 0; r < ways; ++r)
      insert_shard(p, r, ways, sizeof(float), gathered.data<float>() + r * host.numel() + q.offset,
                   out.data<float>() + p.offset);
  }
  if (pipelined) pp->all_reduce(out);  // each parameter is non-zero on one stage only
  return out;
}

Tensor local_arena(const Transformer& model, const Tensor& whole) {
  const ParamLayout &mine = model.layout(), &global = model.global_layout();
  const bool all = whole.numel() == global.total();
  NK_CHECK(whole.dtype() == DType::F32 && whole.device() == kHost &&
               (all || whole.numel() == global.trainable_end()),
           "local_arena: {} is not a host arena of the whole model's layout", whole.desc());
  const nn::ExpertParallel& ep = model.expert_parallel();
  const int64_t n = model.experts_split() ? ep.size() : 1;
  Tensor out = Tensor::zeros({all ? mine.total() : mine.trainable_end()}, DType::F32);
  for (const ParamInfo& p : global.params()) {
    if ((!all && !p.trainable) || !mine.has(p.name)) continue;
    const int64_t ways = p.split == Split::Experts ? n : 1;
    extract_shard(p, ways > 1 ? ep.rank() : 0, ways, sizeof(float), whole.data<float>() + p.offset,
                  out.data<float>() + mine.find(p.name).offset);
  }
  return out;
}

}  // namespace nk::parallel
