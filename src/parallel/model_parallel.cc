#include "parallel/model_parallel.h"

#include <algorithm>
#include <optional>

#include "ops/ops.h"

namespace nk::parallel {

bool owns(const Transformer& model, const ParamInfo& p) {
  // (Whole experts, parallel.etp = 1: replicated over tp as well.)
  if (tensor_split(p).split == Split::Replicated && model.tensor_parallel().rank() != 0)
    return false;
  // Split over etp of the tp ranks (ParamInfo::tp_ways): the first etp
  // ranks hold one copy of every share.
  if (p.tp_ways > 0 && model.tensor_parallel().rank() >= p.tp_ways) return false;
  return !(p.name == "wte" && !model.stage().embedding);
}

namespace {
// owned_sum_squares of the experts' tensors (experts true) or of the rest;
// every_tp_rank: each rank counts its experts (whole split experts: its tp
// peers hold other ones).
double owned_sum_squares_of(const Transformer& model, const Tensor& grads, int64_t begin,
                            int64_t end, std::optional<bool> experts, bool every_tp_rank = false) {
  double sum = 0;
  for (const ParamInfo& p : model.layout().params()) {
    const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel());
    if (experts && *experts != (p.split == Split::Experts)) continue;
    if (p.trainable && hi > lo && (every_tp_rank || owns(model, p)))
      sum += ops::sum_squares(grads.narrow0(lo, hi - lo));
  }
  return sum;
}
// The arena of layout `to` (its total() or trainable_end() elements, `all`)
// put together from every rank of `comm` (n ranks; null: this one) holding
// `local` laid out by `from`: each parameter of `to` that `from` holds from
// its n shards as split(p) divides it (nullopt: left out; replicated: rank
// 0's whole value). Collective over comm.
template <typename SplitOf>
Tensor assemble(const Tensor& local, const ParamLayout& from, const ParamLayout& to, bool all,
                dist::Communicator* comm, int64_t n, SplitOf&& split) {
  Tensor out = Tensor::zeros({all ? to.total() : to.trainable_end()}, DType::F32);
  Tensor gathered = local;
  if (n > 1) {
    gathered = Tensor::empty({n * local.numel()}, DType::F32);
    comm->all_gather(local, gathered);
  }
  for (const ParamInfo& p : to.params()) {
    if ((!all && !p.trainable) || !from.has(p.name)) continue;
    const std::optional<ParamInfo> s = split(p);
    if (!s) continue;
    const int64_t q = from.find(p.name).offset, ways = s->split == Split::Replicated ? 1 : n;
    for (int64_t r = 0; r < ways; ++r)
      insert_shard(*s, r, ways, sizeof(float), gathered.data<float>() + r * local.numel() + q,
                   out.data<float>() + p.offset);
  }
  return out;
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
    // Every ep rank's experts, each rank's share of the rest. Experts split
    // over etp < tp ranks (whole ones: etp = 1): the ep group holds every
    // expert's share of its etp rank once, so the tp ranks below etp alone
    // (one of each share) add the sum.
    const nn::TensorParallel& tp = model.tensor_parallel();
    const bool narrower = tp.experts_narrower();
    Tensor experts = Tensor::zeros({1}, DType::F64);
    *experts.data<double>() = owned_sum_squares_of(model, grads, 0, grads.numel(), true, narrower);
    model.expert_parallel().comm->all_reduce(experts);
    *sum.data<double>() =
        owned_sum_squares_of(model, grads, 0, grads.numel(), false) +
        (narrower && tp.rank() >= tp.expert_size() ? 0.0 : *experts.data<double>());
  } else if (owned)
    for (const auto& [begin, end] : *owned)
      *sum.data<double>() += owned_sum_squares(model, grads, begin, end);
  else
    *sum.data<double>() = owned_sum_squares(model, grads, 0, grads.numel());
  if (data_parallel) data_parallel->all_reduce(sum);
  if (model_parallel) model_parallel->all_reduce(sum);
  return *sum.data<double>();
}

void reduce_tensor_parallel_partial_grads(const Transformer& model) {
  for (const Tensor& g : model.tensor_parallel_partial_grads())
    model.tensor_parallel().comm->all_reduce(g);
  for (const Tensor& g : model.token_split_partial_grads())
    model.tensor_parallel().tokens->all_reduce(g);
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
  Tensor host = local;
  if (local.device() != kHost) {
    host = Tensor::empty(local.shape(), DType::F32);
    ops::copy_to_host(local, host.data<float>());
  }
  const bool pipelined = pp && pp->size() > 1;
  // Split experts: first every rank's experts over the ep group, into the
  // arena of the layout they were split from (this stage's tensor-parallel
  // shards); the rest is this rank's own (equal on every ep rank, or with
  // whole experts, parallel.etp = 1, its own tp shards: its ep group holds
  // its tp peers).
  const ParamLayout* held = &mine;
  if (model.experts_split()) {
    const ParamLayout& unsplit = model.unsplit_layout();
    const nn::ExpertParallel& ep = model.expert_parallel();
    Tensor experts = assemble(host, *held, unsplit, all, ep.comm, ep.size(),
                              [](const ParamInfo& p) -> std::optional<ParamInfo> {
                                if (p.split == Split::Experts) return p;
                                return std::nullopt;
                              });
    for (const ParamInfo& p : unsplit.params()) {
      if ((!all && !p.trainable) || p.split == Split::Experts || !mine.has(p.name)) continue;
      std::copy_n(host.data<float>() + mine.find(p.name).offset, p.numel(),
                  experts.data<float>() + p.offset);
    }
    host = experts;
    held = &unsplit;
  }
  // Then the tensor-parallel shards (expert tensors by their expert split).
  const nn::TensorParallel& tp = model.tensor_parallel();
  Tensor out = assemble(host, *held, whole, all, tp.comm, tp.size(),
                        [&](const ParamInfo& p) -> std::optional<ParamInfo> {
                          // The tied head's copy of the table: the first stage's is the one.
                          if (pipelined && p.name == "wte" && !model.stage().embedding)
                            return std::nullopt;
                          return tensor_split(p);
                        });
  if (pipelined) pp->all_reduce(out);  // each parameter is non-zero on one stage only
  return out;
}

Tensor local_arena(const Transformer& model, const Tensor& unsplit) {
  const ParamLayout &mine = model.layout(), &from = model.unsplit_layout();
  const bool all = unsplit.numel() == from.total();
  NK_CHECK(unsplit.dtype() == DType::F32 && unsplit.device() == kHost &&
               (all || unsplit.numel() == from.trainable_end()),
           "local_arena: {} is not a host arena of the model's layout before the experts' split",
           unsplit.desc());
  const nn::ExpertParallel& ep = model.expert_parallel();
  const int64_t n = model.experts_split() ? ep.size() : 1;
  Tensor out = Tensor::zeros({all ? mine.total() : mine.trainable_end()}, DType::F32);
  for (const ParamInfo& p : from.params()) {
    if ((!all && !p.trainable) || !mine.has(p.name)) continue;
    const int64_t ways = p.split == Split::Experts ? n : 1;
    extract_shard(p, ways > 1 ? ep.rank() : 0, ways, sizeof(float),
                  unsplit.data<float>() + p.offset, out.data<float>() + mine.find(p.name).offset);
  }
  return out;
}

}  // namespace nk::parallel
