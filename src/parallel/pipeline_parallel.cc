#include "parallel/pipeline_parallel.h"

#include <algorithm>
#include <chrono>
#include <span>

#include "core/error.h"
#include "ops/ops.h"

namespace nk::parallel {

namespace {
constexpr int kForwardTag = 11;      // activations, stage s -> s + 1 (and the last -> 0)
constexpr int kBackwardTag = 12;     // their gradients, the other way
constexpr int kMoeForwardTag = 13;   // MoE routing records, with the activations
constexpr int kMoeBackwardTag = 14;  // and with their gradients

// Adds the seconds from construction to destruction to `into`.
struct WaitTimer {
  double& into;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  ~WaitTimer() {
    into += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};
}  // namespace

PipelineStage pipeline_stage(const ModelConfig& cfg, int64_t pp, int64_t rank,
                             const std::vector<int64_t>& layers, int64_t vp) {
  NK_CHECK(pp >= 1 && rank >= 0 && rank < pp, "pipeline_stage: rank {} of {}", rank, pp);
  if (vp < 1) fail("parallel.vp = {} must be at least 1", vp);
  PipelineStage s;
  s.embedding = rank == 0;
  s.head = rank == pp - 1;
  // Layers per virtual stage, in model order (virtual stage c·pp + r is
  // rank r's chunk c).
  const int64_t stages = pp * vp;
  std::vector<int64_t> counts = layers;
  if (counts.empty()) {
    if (cfg.n_layer % stages && vp > 1)
      fail(
          "model.n_layer = {} is not divisible by parallel.pp × parallel.vp = {} × {} (each "
          "virtual stage runs as many layers; parallel.pp_layout sets an uneven split)",
          cfg.n_layer, pp, vp);
    if (cfg.n_layer % stages)
      fail(
          "model.n_layer = {} is not divisible by parallel.pp = {} (each stage runs as many "
          "layers; parallel.pp_layout sets an uneven split)",
          cfg.n_layer, pp);
    counts.assign(size_t(stages), cfg.n_layer / stages);
  }
  if (int64_t(counts.size()) != stages) {
    if (vp > 1)
      fail(
          "parallel.pp_layout: {} stages listed, parallel.pp × parallel.vp = {} × {} (with "
          "virtual stages it lists each one's layers, in model order)",
          counts.size(), pp, vp);
    fail("parallel.pp_layout: {} stages listed, parallel.pp = {}", counts.size(), pp);
  }
  int64_t sum = 0;
  for (int64_t c : counts) {
    if (c < 0) fail("parallel.pp_layout: a stage of {} layers", c);
    sum += c;
  }
  if (sum != cfg.n_layer)
    fail("parallel.pp_layout: the stages' layers add up to {}, model.n_layer = {}", sum,
         cfg.n_layer);
  int64_t first = 0;
  for (int64_t k = 0; k < stages; ++k) {
    if (k % pp == rank) s.chunks.emplace_back(first, first + counts[size_t(k)]);
    first += counts[size_t(k)];
  }
  return s;
}

PipelineParallel::PipelineParallel(Transformer& model, dist::Communicator& pp,
                                   dist::Communicator* embedding, int64_t B, int64_t T,
                                   const std::vector<Recompute>& recompute)
    : model_(model),
      pp_(pp),
      embedding_(embedding),
      B_(B),
      T_(T),
      recompute_(recompute),
      stage_(pp.rank()),
      stages_(pp.size()),
      chunks_(model.stage().ranges(model.config())),
      moe_(model.config().is_moe()) {
  state_.resize(chunks_.size());
  // One set per chunk now (the log's figure); more as micro-batches come in flight.
  for (int64_t c = 0; c < int64_t(chunks_.size()); ++c) {
    acts(c, -1);
    release(c, -1);
  }
}

int64_t pipeline_warmup_steps(int64_t p, int64_t stage, int64_t v, int64_t m) {
  const int64_t total = m * v;
  if (v == 1) return std::min(p - stage - 1, m);
  return m == p ? total : std::min((p - stage - 1) * 2 + (v - 1) * p, total);
}

int64_t pipeline_max_in_flight(int64_t p, int64_t stage, int64_t v, int64_t m) {
  return std::min(pipeline_warmup_steps(p, stage, v, m) + 1, m * v);
}

int64_t PipelineParallel::warmup_steps(int64_t m) const {
  return pipeline_warmup_steps(stages_, stage_, int64_t(chunks_.size()), m);
}

int64_t PipelineParallel::max_in_flight(int64_t m) const {
  return pipeline_max_in_flight(stages_, stage_, int64_t(chunks_.size()), m);
}

Activations& PipelineParallel::acts(int64_t chunk, int64_t j) {
  Chunk& st = state_[size_t(chunk)];
  for (auto& [mb, a] : st.busy)
    if (mb == j) return *a;
  std::unique_ptr<Activations> a;
  if (!st.free.empty()) {
    if (chunks_.size() > 1) wait_sends();  // a send from it may still be pending
    a = std::move(st.free.back());
    st.free.pop_back();
  } else {
    PipelineStage part;
    part.chunks = {chunks_[size_t(chunk)]};
    part.embedding = first_chunk(chunk);
    part.head = last_chunk(chunk);
    a = std::make_unique<Activations>(model_.config(), model_.compute_dtype(), B_, T_, true,
                                      model_.device(), recompute_, model_.tensor_parallel(), part,
                                      model_.expert_parallel().size());
  }
  st.busy.emplace_back(j, std::move(a));
  return *st.busy.back().second;
}

void PipelineParallel::release(int64_t chunk, int64_t j) {
  Chunk& st = state_[size_t(chunk)];
  for (size_t i = 0; i < st.busy.size(); ++i)
    if (st.busy[i].first == j) {
      st.free.push_back(std::move(st.busy[i].second));
      st.busy.erase(st.busy.begin() + int64_t(i));
      return;
    }
  NK_CHECK(false, "PipelineParallel: micro-batch {} of chunk {} is not in flight", j, chunk);
}

int64_t PipelineParallel::activation_bytes() const {
  int64_t n = 0;
  for (const Chunk& st : state_) {
    for (const auto& a : st.free) n += a->bytes();
    for (const auto& [j, a] : st.busy) n += a->bytes();
  }
  return n;
}

void PipelineParallel::wait_sends() {
  WaitTimer timer{wait_s_};
  for (dist::WorkPtr& w : sending_) w->wait();
  sending_.clear();
}

void PipelineParallel::take(std::map<std::pair<int64_t, int64_t>, Posted>& from, int64_t chunk,
                            int64_t j, const Tensor& x, int src, int tag) {
  auto it = from.find({chunk, j});
  if (it == from.end()) return receive(x, src, tag);
  {
    WaitTimer timer{wait_s_};
    it->second.work->wait();
  }
  ops::convert(x, it->second.buffer);
  from.erase(it);
}

void PipelineParallel::post_receives(int64_t m) {
  // In schedule order: messages from one rank with one tag match the
  // receives in the order they were posted.
  const int64_t p = stages_, v = int64_t(chunks_.size()), total = m * v;
  const int prev = int(stage_ > 0 ? stage_ - 1 : stages_ - 1);
  const int next = int(stage_ < stages_ - 1 ? stage_ + 1 : 0);
  const auto chunk_of = [&](int64_t k) { return (k % (p * v)) / p; };
  const auto mb_of = [&](int64_t k) { return (k / (p * v)) * p + k % p; };
  for (int64_t k = 0; k < total; ++k) {
    const int64_t c = chunk_of(k), j = mb_of(k);
    if (first_chunk(c)) continue;
    Tensor& buffer = input_buffers_[{c, j}];
    if (!buffer.defined()) {
      const Tensor like = acts(c, j).residual(chunks_[size_t(c)].first);
      release(c, j);
      buffer = Tensor::empty(like.shape(), like.dtype(), like.device());
    }
    Posted& in = inputs_[{c, j}];
    in.buffer = buffer;
    in.work = pp_.recv_async(in.buffer, prev, kForwardTag);
    if (moe_) post_record(moe_inputs_, moe_input_buffers_, c, j, prev, kMoeForwardTag);
  }
  for (int64_t k = 0; k < total; ++k) {
    const int64_t c = v - 1 - chunk_of(k), j = mb_of(k);
    if (last_chunk(c)) continue;
    Tensor& buffer = grad_buffers_[{c, j}];
    if (!buffer.defined()) {
      const Tensor like = acts(c, j).residual_grad();
      release(c, j);
      buffer = Tensor::empty(like.shape(), like.dtype(), like.device());
    }
    Posted& g = grads_[{c, j}];
    g.buffer = buffer;
    g.work = pp_.recv_async(g.buffer, next, kBackwardTag);
    if (moe_) post_record(moe_grads_, moe_grad_buffers_, c, j, next, kMoeBackwardTag);
  }
}

void PipelineParallel::post_record(std::map<std::pair<int64_t, int64_t>, Posted>& to,
                                   std::map<std::pair<int64_t, int64_t>, Tensor>& buffers,
                                   int64_t chunk, int64_t j, int src, int tag) {
  Tensor& buffer = buffers[{chunk, j}];
  if (!buffer.defined()) {
    const int64_t n = acts(chunk, j).moe_record_size();
    release(chunk, j);
    buffer = Tensor::empty({n}, DType::F64);
  }
  Posted& r = to[{chunk, j}];
  r.buffer = buffer;
  r.work = pp_.recv_async(r.buffer, src, tag);
}

void PipelineParallel::receive(const Tensor& x, int src, int tag) {
  dist::WorkPtr r = pp_.recv_async(x, src, tag);
  wait_sends();
  WaitTimer timer{wait_s_};
  r->wait();
}

// Chunk `chunk` of micro-batch j, forward: its input (embedded tokens, or the
// previous virtual stage's output: the previous rank's, or the last rank's
// previous chunk's), its layers, then the loss (the model's last chunk; with
// backward its gradient too, as the fused head does) or the send onward.
void PipelineParallel::forward(int64_t chunk, int64_t j, const Tensor& tokens,
                               const Tensor& targets, const PackedBatchInfo* packed, bool backward,
                               float grad_scale, const Head& head, double& loss) {
  const auto [first, last] = chunks_[size_t(chunk)];
  Activations& a = acts(chunk, j);
  if (!first_chunk(chunk))
    take(inputs_, chunk, j, a.residual(first), int(stage_ > 0 ? stage_ - 1 : stages_ - 1),
         kForwardTag);
  if (weights_) weights_->use_chunk(first, last, first_chunk(chunk), last_chunk(chunk));
  if (first_chunk(chunk)) model_.embed_forward(a, tokens, packed);
  if (moe_ && !first_chunk(chunk))
    receive_moe_record(a, false, int(stage_ > 0 ? stage_ - 1 : stages_ - 1), chunk, j);
  model_.blocks_forward(a, first, last, packed);
  if (last_chunk(chunk)) {
    loss += head ? head(a, j, backward, grad_scale)
                 : model_.head_loss(a, targets, backward, grad_scale);
    // With the backward to come (the schedule runs it next on the last
    // stage, without interleaving), the layers stay resident for it: one
    // gather of theirs a micro-batch, not two.
    if (weights_) weights_->done_chunk(first, backward ? first : last, first_chunk(chunk), true);
    if (moe_ && backward) {  // every layer's routing is in a's record now
      const Transformer::MoeLosses f = model_.moe_losses(a);
      moe_losses_.aux += f.aux;
      moe_losses_.z += f.z;
      moe_losses_.dropped += f.dropped;
      moe_losses_.load_max = std::max(moe_losses_.load_max, f.load_max);
      const auto& counts = a.expert_counts();
      for (size_t l = 0; l < counts.size(); ++l)
        for (size_t e = 0; e < counts[l].size(); ++e)
          expert_load_[l * counts[l].size() + e] += double(counts[l][e]);
    }
  } else {
    if (weights_) weights_->done_chunk(first, last, first_chunk(chunk), false);
    sending_.push_back(
        pp_.send_async(a.residual(last), int(stage_ < stages_ - 1 ? stage_ + 1 : 0), kForwardTag));
    if (moe_) send_moe_record(a, false, int(stage_ < stages_ - 1 ? stage_ + 1 : 0));
  }
}

void PipelineParallel::send_moe_record(Activations& a, bool backward, int dst) {
  auto& [fwd, bwd] = records_[&a];
  Tensor& r = backward ? bwd : fwd;
  if (!r.defined()) r = Tensor::empty({a.moe_record_size()}, DType::F64);
  a.write_moe_record(std::span<double>(r.data<double>(), size_t(r.numel())));
  sending_.push_back(pp_.send_async(r, dst, backward ? kMoeBackwardTag : kMoeForwardTag));
}

void PipelineParallel::receive_moe_record(Activations& a, bool backward, int src, int64_t chunk,
                                          int64_t j) {
  const auto [first, last] = chunks_[size_t(chunk)];
  auto& [fwd, bwd] = records_[&a];
  Tensor& r = backward ? bwd : fwd;
  if (!r.defined()) r = Tensor::empty({a.moe_record_size()}, DType::F64);
  // Interleaved: taken from its posted receive (else received now).
  take(backward ? moe_grads_ : moe_inputs_, chunk, j, r, src,
       backward ? kMoeBackwardTag : kMoeForwardTag);
  a.read_moe_record(std::span<const double>(r.data<double>(), size_t(r.numel())), first, last);
}

// The last stage's MoE figures of the step on every stage (the others add zeros).
void PipelineParallel::moe_from_last_stage(int64_t m) {
  const size_t n = expert_load_.size();
  Tensor t = Tensor::zeros({int64_t(n + 4)}, DType::F64);
  double* v = t.data<double>();
  if (stage_ == stages_ - 1) {
    std::copy(expert_load_.begin(), expert_load_.end(), v);
    v[n] = moe_losses_.aux / double(m);
    v[n + 1] = moe_losses_.z / double(m);
    v[n + 2] = moe_losses_.dropped / double(m);
    v[n + 3] = moe_losses_.load_max;
  }
  pp_.all_reduce(t);
  std::copy(v, v + n, expert_load_.begin());
  moe_losses_.aux = v[n];
  moe_losses_.z = v[n + 1];
  moe_losses_.dropped = v[n + 2];
  moe_losses_.load_max = v[n + 3];
}

// Backward of chunk `chunk` of micro-batch j: the gradient of its output (from
// the loss, or received from the next virtual stage) back through its layers,
// then into the embedding (the model's first chunk) or sent back. Its
// activations are free again after (a pending send from them completes with
// this rank's next receive, before any forward but the first chunk's, which
// sends nothing backward, writes them).
void PipelineParallel::backward(int64_t chunk, int64_t j, const Tensor& tokens,
                                const PackedBatchInfo* packed) {
  const auto [first, last] = chunks_[size_t(chunk)];
  Activations& a = acts(chunk, j);
  if (!last_chunk(chunk)) {
    take(grads_, chunk, j, a.residual_grad(), int(stage_ < stages_ - 1 ? stage_ + 1 : 0),
         kBackwardTag);
    if (moe_) receive_moe_record(a, true, int(stage_ < stages_ - 1 ? stage_ + 1 : 0), chunk, j);
  }
  // (The head's backward ran with its forward; the embeddings' reads no
  // weights but p-tuning's prompt encoder, gathered for it under FSDP.)
  if (weights_) weights_->use_chunk(first, last, false, false);
  model_.blocks_backward(a, first, last, packed);
  if (weights_) weights_->done_chunk(first, last, false, false);
  if (first_chunk(chunk)) {
    const bool prompt = weights_ && model_.config().prompt.enabled();
    if (prompt) weights_->use_chunk(0, 0, true, false);
    model_.embed_backward(a, tokens, packed);
    if (prompt) weights_->done_chunk(0, 0, true, false);
  } else {
    sending_.push_back(pp_.send_async(a.residual_grad(), int(stage_ > 0 ? stage_ - 1 : stages_ - 1),
                                      kBackwardTag));
    if (moe_) send_moe_record(a, true, int(stage_ > 0 ? stage_ - 1 : stages_ - 1));
  }
  release(chunk, j);
}

double PipelineParallel::from_last_stage(double v) {
  Tensor t = Tensor::empty({1}, DType::F64);
  *t.data<double>() = stage_ == stages_ - 1 ? v : 0.0;
  pp_.all_reduce(t);
  return *t.data<double>();
}

double PipelineParallel::forward_backward(const std::vector<Tensor>& tokens,
                                          const std::vector<Tensor>& targets, float grad_scale,
                                          const std::vector<const PackedBatchInfo*>& packed) {
  const int64_t m = int64_t(tokens.size()), p = stages_, v = int64_t(chunks_.size());
  NK_CHECK(m > 0 && int64_t(targets.size()) == m, "PipelineParallel: {} tokens, {} targets", m,
           targets.size());
  NK_CHECK(packed.empty() || int64_t(packed.size()) == m,
           "PipelineParallel: {} packing infos for {} micro-batches", packed.size(), m);
  const auto packing = [&](int64_t j) { return packed.empty() ? nullptr : packed[size_t(j)]; };
  NK_CHECK(v == 1 || m % p == 0,
           "PipelineParallel: the interleaved schedule needs micro-batches in multiples of {}", p);
  // Virtual step k: its chunk (forward order; backward runs them in reverse)
  // and micro-batch.
  const auto chunk_of = [&](int64_t k) { return v == 1 ? 0 : (k % (p * v)) / p; };
  const auto mb_of = [&](int64_t k) { return v == 1 ? k : (k / (p * v)) * p + k % p; };
  const int64_t total = m * v, warmup = warmup_steps(m);
  if (v > 1) post_receives(m);
  double loss = 0;
  if (moe_) {
    moe_losses_ = {};
    expert_load_.assign(size_t(model_.config().n_layer * model_.config().num_experts), 0.0);
  }
  auto F = [&](int64_t k) {
    const int64_t j = mb_of(k);
    forward(chunk_of(k), j, tokens[size_t(j)], targets[size_t(j)], packing(j), true, grad_scale,
            head_, loss);
  };
  auto Bk = [&](int64_t k) {
    const int64_t j = mb_of(k);
    backward(v - 1 - chunk_of(k), j, tokens[size_t(j)], packing(j));
  };
  for (int64_t k = 0; k < warmup; ++k) F(k);
  for (int64_t i = 0; i < total - warmup; ++i) {  // steady state: one forward, one backward
    F(warmup + i);
    Bk(i);
  }
  for (int64_t i = total - warmup; i < total; ++i) Bk(i);
  wait_sends();
  NK_CHECK(inputs_.empty() && grads_.empty() && moe_inputs_.empty() && moe_grads_.empty(),
           "PipelineParallel: {} posted receives unused",
           inputs_.size() + grads_.size() + moe_inputs_.size() + moe_grads_.size());
  WaitTimer timer{wait_s_};  // the loss from the last stage: every stage waits for it
  if (moe_) moe_from_last_stage(m);
  return from_last_stage(loss);
}

double PipelineParallel::forward_loss(const Tensor& tokens, const Tensor& targets,
                                      const PackedBatchInfo* packed) {
  return forward_head(tokens, targets, head_, packed);
}

double PipelineParallel::forward_head(const Tensor& tokens, const Tensor& targets, const Head& head,
                                      const PackedBatchInfo* packed) {
  double loss = 0;
  for (int64_t c = 0; c < int64_t(chunks_.size()); ++c)
    forward(c, 0, tokens, targets, packed, false, 0.f, head, loss);
  wait_sends();
  for (int64_t c = 0; c < int64_t(chunks_.size()); ++c) release(c, 0);
  return from_last_stage(loss);
}

void PipelineParallel::reduce_embedding_grads() {
  if (!embedding_ || embedding_->size() < 2 || !model_.config().head_tied()) return;
  const ParamInfo& p = model_.layout().find("wte");
  if (p.trainable) embedding_->all_reduce(ParamLayout::view(model_.grads(), p));
}

}  // namespace nk::parallel
