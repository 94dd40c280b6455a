#include "parallel/distributed_data_parallel.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace nk::parallel {

DistributedDataParallel::DistributedDataParallel(Transformer& model, dist::Communicator& grads,
                                                 const DdpConfig& cfg,
                                                 dist::Communicator* expert_grads,
                                                 dist::Communicator* expert_norm)
    : model_(model),
      comm_(grads),
      cfg_(cfg),
      buckets_(plan_grad_buckets(model.layout(), model.config().n_layer, cfg.bucket_elems(),
                                 cfg.shard == Shard::Full)) {
  if (model_.experts_split()) {
    NK_CHECK(expert_grads && expert_norm,
             "DistributedDataParallel: split experts without the expert-dp and ep groups");
    expert_grads_ = expert_grads;
    expert_norm_ = expert_norm;
    // The replicas of each parameter: every dp rank, or for an expert tensor
    // the ranks holding the same experts.
    for (const ParamInfo& p : model_.layout().params())
      if (model_.has_master(p))
        (p.split == Split::Experts ? *expert_grads_ : comm_)
            .broadcast(model_.params().narrow0(p.offset, p.numel()), 0);
  } else {
    comm_.broadcast(model_.params(), 0);
  }
  model_.sync_compute_params();
  const bool bf16_master = model_.compute_params().raw() != model_.params().raw();
  if (cfg_.shard == Shard::Full)
    weights_ = std::make_unique<ShardedWeights>(model_, comm_, buckets_, expert_grads_);
  const bool gathers = cfg_.shard == Shard::Optimizer || cfg_.shard == Shard::Gradients;
  if (gathers && bf16_master)
    for (const GradBucket& b : buckets_) release_other_blocks(model_.params(), b, group_of(b));
  master_sharded_ = weights_ || (gathers && bf16_master);
  unit_buckets_ = stage_buckets(model_.layout(), model_.config().n_layer,
                                model_.config().head_tied(), buckets_);
  param_gathers_.resize(buckets_.size());
  grads_released_.assign(buckets_.size(), true);
  if (shards_grads()) {                 // from the start: only this rank's blocks resident
    advise_huge_pages(model_.grads());  // released and written again every micro-batch
    for (const GradBucket& b : buckets_) zero_other_blocks(model_.grads(), b, group_of(b));
  }
}

void DistributedDataParallel::zero_grads() {
  if (!shards_grads()) return model_.zero_grads();
  NK_CHECK(pending_.empty(), "DistributedDataParallel: zero_grads() before wait_grads()");
  for (const ShardPiece& p : optimizer_pieces())
    if (p.own_end > p.own_begin)
      ops::fill(model_.grads().narrow0(p.own_begin, p.own_end - p.own_begin), 0.f);
}

void DistributedDataParallel::release_grads(size_t k) {
  if (grads_released_[k]) return;
  zero_other_blocks(model_.grads(), buckets_[k], group_of(buckets_[k]));
  grads_released_[k] = true;
}

void DistributedDataParallel::finish_reductions(size_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t k = 0; k < n; ++k)
    if (!grads_released_[k]) {
      pending_[k]->wait();
      release_grads(k);
    }
  grad_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A page-residency scan of the whole gradient arena (mincore): measured at
// about 180 us for 500 MiB on the Zen 5 VM, so once per backward stage costs
// GPT-2 124M about 2 ms a micro-batch against seconds of compute. Per stage,
// as the peak falls between a stage's backward and its buckets' release.
void DistributedDataParallel::note_grad_resident() {
  grad_peak_ = std::max(grad_peak_, resident_bytes(model_.grads()));
}

size_t DistributedDataParallel::take_grad_peak() {
  const size_t p = grad_peak_;
  grad_peak_ = 0;
  return p;
}

void DistributedDataParallel::use(int64_t unit, int64_t next) {
  if (!weights_ && params_pending_ == 0) return;
  auto t0 = std::chrono::steady_clock::now();
  if (weights_) {
    weights_->gather(unit);
    if (next >= 0) weights_->prefetch(next);
  } else {
    for (size_t k : unit_buckets_[size_t(unit)]) finish_param_gather(k);
    for (auto& w : param_gathers_)  // MPI progresses the others only inside MPI calls
      if (w) w->test();
  }
  param_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void DistributedDataParallel::finish_param_gather(size_t k) {
  if (!param_gathers_[k]) return;
  param_gathers_[k]->wait();
  param_gathers_[k].reset();
  --params_pending_;
}

void DistributedDataParallel::finish_param_gathers() {
  for (size_t k = 0; k < buckets_.size(); ++k) finish_param_gather(k);
}

void DistributedDataParallel::done(int64_t unit) {
  if (weights_) weights_->release(unit);
}

// Units are the backward stages (grad_buckets.h); each one's successor is prefetched.
void DistributedDataParallel::staged_forward(Activations& a, const Tensor& tokens,
                                             const PackedBatchInfo* packed) {
  const int64_t L = model_.config().n_layer;
  use(embed_stage(L), L > 0 ? block_stage(L, 0) : kHeadStage);
  model_.embed_forward(a, tokens, packed);
  done(embed_stage(L));
  for (int64_t l = 0; l < L; ++l) {
    use(block_stage(L, l), l + 1 < L ? block_stage(L, l + 1) : kHeadStage);
    model_.blocks_forward(a, l, l + 1, packed);
    done(block_stage(L, l));
  }
}

float DistributedDataParallel::forward_loss(Activations& a, const Tensor& tokens,
                                            const Tensor& targets, const PackedBatchInfo* packed) {
  if (!weights_ && params_pending_ == 0) return model_.forward_loss(a, tokens, targets, packed);
  return float(forward_head(
      a, tokens, [&] { return double(model_.head_loss(a, targets, false, 0.f)); }, packed));
}

void DistributedDataParallel::launch_ready(int64_t stage) {
  // Buckets are sorted by ready stage, so every rank starts the same
  // all-reduces in the same order (MPI and NCCL need that).
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].ready_stage <= stage) {
    const GradBucket& b = buckets_[next_bucket_++];
    Tensor grads = model_.grads().narrow0(b.begin, b.numel());
    dist::Communicator& c = group_of(b);
    grads_released_[next_bucket_ - 1] = !shards_grads();
    pending_.push_back(sharded() ? c.reduce_scatter_v_async(grads, shard_counts(b, c.size()))
                                 : c.all_reduce_async(grads, dist::ReduceOp::Sum));
  }
}

void DistributedDataParallel::poll() {
  for (size_t k = 0; k < pending_.size(); ++k)
    if (pending_[k]->test() && shards_grads()) release_grads(k);
}

float DistributedDataParallel::forward_backward(Activations& a, const Tensor& tokens,
                                                const Tensor& targets, float grad_scale,
                                                bool reduce, const PackedBatchInfo* packed) {
  if (!reduce && !shards_grads() && params_pending_ == 0)
    return model_.forward_backward(a, tokens, targets, grad_scale, packed);
  return float(forward_backward(
      a, tokens, reduce, [&] { return double(model_.head_loss(a, targets, true, grad_scale)); },
      packed));
}

double DistributedDataParallel::forward_head(Activations& a, const Tensor& tokens,
                                             const HeadFn& head, const PackedBatchInfo* packed) {
  staged_forward(a, tokens, packed);
  use(kHeadStage, -1);
  const double v = head();
  done(kHeadStage);
  return v;
}

double DistributedDataParallel::forward_backward(Activations& a, const Tensor& tokens, bool reduce,
                                                 const HeadFn& head,
                                                 const PackedBatchInfo* packed) {
  // Sharded gradients: every micro-batch reduces; one that does not end the
  // step waits for its reductions here.
  const bool step_end = reduce;
  reduce = reduce || shards_grads();
  NK_CHECK(!reduce || (pending_.empty() && next_bucket_ == 0),
           "DistributedDataParallel: wait_grads() before the next reducing micro-batch");
  const bool overlap = reduce && cfg_.overlap_grad_reduce;
  const int64_t L = model_.config().n_layer;
  // Transformer::forward_backward's stages, with the backward cut per block
  // (and the weight gathers of FSDP and ZeRO-1 before each stage).
  staged_forward(a, tokens, packed);
  use(kHeadStage, L > 0 ? block_stage(L, L - 1) : -1);
  const double loss = head();
  done(kHeadStage);
  if (overlap) launch_ready(kHeadStage);
  for (int64_t l = L - 1; l >= 0; --l) {
    use(block_stage(L, l), l > 0 ? block_stage(L, l - 1) : -1);
    model_.blocks_backward(a, l, l + 1, packed);
    done(block_stage(L, l));
    if (shards_grads()) note_grad_resident();
    if (overlap) {
      const size_t before = next_bucket_;
      launch_ready(block_stage(L, l));
      poll();
      // Sharded gradients: the buckets started a stage ago are finished and
      // handed back now (MPI moves them only inside its calls: left to
      // progress by polls alone, most would wait for the end of the
      // backward, every page of them resident until then).
      if (shards_grads()) finish_reductions(before);
    }
  }
  // The embeddings' backward reads no weights, but p-tuning's prompt encoder
  // (in the embeddings' unit) runs its backward there.
  const bool prompt = model_.config().prompt.enabled();
  if (prompt) use(embed_stage(L), -1);
  model_.embed_backward(a, tokens, packed);
  if (prompt) done(embed_stage(L));
  if (!reduce) return loss;
  launch_rest();
  if (shards_grads()) note_grad_resident();
  if (!step_end) finish_all_reductions();  // its time counted by the step's wait_grads()
  return loss;
}

void DistributedDataParallel::launch_rest() {
  launch_ready(embed_stage(model_.config().n_layer));  // the last stage of the backward
  NK_CHECK(next_bucket_ == buckets_.size(), "DistributedDataParallel: {} of {} buckets started",
           next_bucket_, buckets_.size());
}

void DistributedDataParallel::reduce_grads() {
  NK_CHECK(pending_.empty() && next_bucket_ == 0,
           "DistributedDataParallel: wait_grads() before reducing again");
  launch_rest();
}

// The units of a pipeline chunk, in the order it reads them.
namespace {
std::vector<int64_t> chunk_units(int64_t L, int64_t first, int64_t last, bool embedding,
                                 bool head) {
  std::vector<int64_t> u;
  if (embedding) u.push_back(embed_stage(L));
  for (int64_t l = first; l < last; ++l) u.push_back(block_stage(L, l));
  if (head) u.push_back(kHeadStage);
  return u;
}
}  // namespace

void DistributedDataParallel::use_chunk(int64_t first, int64_t last, bool embedding, bool head) {
  if (!weights_) return;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int64_t> units =
      chunk_units(model_.config().n_layer, first, last, embedding, head);
  for (int64_t u : units) weights_->prefetch(u);  // every gather posted, then waited for
  for (int64_t u : units) weights_->gather(u);
  param_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void DistributedDataParallel::done_chunk(int64_t first, int64_t last, bool embedding, bool head) {
  if (!weights_) return;
  for (int64_t u : chunk_units(model_.config().n_layer, first, last, embedding, head))
    weights_->release(u);
}

double DistributedDataParallel::sum_over_group(double v) {
  Tensor t = Tensor::empty({1}, DType::F64);
  *t.data<double>() = v;
  comm_.all_reduce(t, dist::ReduceOp::Sum);
  return *t.data<double>();
}

int DistributedDataParallel::max_over_group(int v) {
  Tensor t = Tensor::empty({1}, DType::I32);
  *t.data<int32_t>() = v;
  comm_.all_reduce(t, dist::ReduceOp::Max);
  return *t.data<int32_t>();
}

std::vector<ShardPiece> DistributedDataParallel::optimizer_pieces() const {
  if (!sharded()) return owned_shards(buckets_, 1, 0);
  std::vector<ShardPiece> out;  // bucket by bucket: each over its own group
  for (const GradBucket& b : buckets_) {
    const dist::Communicator& c = group_of(b);
    const std::vector<ShardPiece> one = owned_shards({b}, c.size(), c.rank());
    out.insert(out.end(), one.begin(), one.end());
  }
  return out;
}

double DistributedDataParallel::grad_norm_squared() {
  NK_CHECK(pending_.empty(), "DistributedDataParallel: grad_norm_squared() before wait_grads()");
  if (!sharded() && !expert_norm_) return ops::sum_squares(model_.grads());
  if (!sharded()) {
    // Split experts: every rank of the ep group holds other experts; the
    // rest is the same on every rank.
    double dense = 0;
    Tensor experts = Tensor::zeros({1}, DType::F64);
    for (const GradBucket& b : buckets_) {
      const double s = ops::sum_squares(model_.grads().narrow0(b.begin, b.numel()));
      (b.experts ? *experts.data<double>() : dense) += s;
    }
    expert_norm_->all_reduce(experts);
    return dense + *experts.data<double>();
  }
  // ZeRO-1: the dp ranks' owned blocks partition the dense gradient, and
  // (split experts) the expert-dp ranks' blocks each ep rank's experts', so
  // the sum over the dp group (ep x expert-dp ranks) counts everything once.
  double local = 0;
  for (const ShardPiece& p : optimizer_pieces())
    if (p.own_end > p.own_begin)
      local += ops::sum_squares(model_.grads().narrow0(p.own_begin, p.own_end - p.own_begin));
  return sum_over_group(local);
}

void DistributedDataParallel::gather_full_weights() {
  finish_param_gathers();
  if (weights_)
    weights_->gather_all_master();
  else if (master_sharded_ && model_.params().numel() > 0)
    gather_master(model_, comm_, buckets_, expert_grads_);
  // (A bf16 master kept by the optimizer has released the model's f32 arena:
  // the trainer joins its blocks itself.)
}

void DistributedDataParallel::gather_params() {
  if (cfg_.shard != Shard::Optimizer && cfg_.shard != Shard::Gradients) return;
  NK_CHECK(params_pending_ == 0, "DistributedDataParallel: gather_params() twice");
  // In launch order, which is every rank's. The compute-dtype weights: AdamW's
  // fused update has refreshed this rank's blocks of them (bf16: rounded from
  // its master blocks, as a full conversion would round them).
  for (size_t k = 0; k < buckets_.size(); ++k) {
    const GradBucket& b = buckets_[k];
    dist::Communicator& c = group_of(b);
    param_gathers_[k] = c.all_gather_v_async(model_.compute_params().narrow0(b.begin, b.numel()),
                                             shard_counts(b, c.size()));
    ++params_pending_;
  }
}

void DistributedDataParallel::finish_all_reductions() {
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t k = 0; k < pending_.size(); ++k) {
    pending_[k]->wait();
    release_grads(k);
  }
  pending_.clear();
  next_bucket_ = 0;
  grad_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double DistributedDataParallel::wait_grads() {
  finish_all_reductions();
  const double waited = param_wait_s_ + grad_wait_s_;
  param_wait_s_ = grad_wait_s_ = 0;
  return waited;
}

}  // namespace nk::parallel
