#include "parallel/pipeline_parallel.h"

#include <chrono>

#include "core/error.h"

namespace nk::parallel {

namespace {
constexpr int kForwardTag = 11;   // activations, stage s -> s + 1
constexpr int kBackwardTag = 12;  // their gradients, stage s + 1 -> s

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
                             const std::vector<int64_t>& layers) {
  NK_CHECK(pp >= 1 && rank >= 0 && rank < pp, "pipeline_stage: rank {} of {}", rank, pp);
  std::vector<int64_t> counts = layers;
  if (counts.empty()) {
    if (cfg.n_layer % pp)
      fail(
          "model.n_layer = {} is not divisible by parallel.pp = {} (each stage runs as many "
          "layers; parallel.pp_layout sets an uneven split)",
          cfg.n_layer, pp);
    counts.assign(size_t(pp), cfg.n_layer / pp);
  }
  if (int64_t(counts.size()) != pp)
    fail("parallel.pp_layout: {} stages listed, parallel.pp = {}", counts.size(), pp);
  int64_t sum = 0;
  for (int64_t c : counts) {
    if (c < 0) fail("parallel.pp_layout: a stage of {} layers", c);
    sum += c;
  }
  if (sum != cfg.n_layer)
    fail("parallel.pp_layout: the stages' layers add up to {}, model.n_layer = {}", sum,
         cfg.n_layer);
  PipelineStage s;
  for (int64_t r = 0; r < rank; ++r) s.first += counts[size_t(r)];
  s.last = s.first + counts[size_t(rank)];
  s.embedding = rank == 0;
  s.head = rank == pp - 1;
  return s;
}

PipelineParallel::PipelineParallel(Transformer& model, dist::Communicator& pp,
                                   dist::Communicator* embedding, int64_t B, int64_t T,
                                   const std::vector<Recompute>& recompute)
    : model_(model),
      pp_(pp),
      embedding_(embedding),
      stage_(pp.rank()),
      stages_(pp.size()),
      first_(model.stage().first),
      last_(model.stage().end(model.config())) {
  for (int64_t k = 0; k < stages_ - stage_; ++k)
    acts_.push_back(std::make_unique<Activations>(model_, B, T, true, recompute));
}

int64_t PipelineParallel::activation_bytes() const {
  int64_t n = 0;
  for (const auto& a : acts_) n += a->bytes();
  return n;
}

void PipelineParallel::wait_sends() {
  WaitTimer timer{wait_s_};
  for (dist::WorkPtr& w : sending_) w->wait();
  sending_.clear();
}

void PipelineParallel::receive(const Tensor& x, int src, int tag) {
  dist::WorkPtr r = pp_.recv_async(x, src, tag);
  wait_sends();
  WaitTimer timer{wait_s_};
  r->wait();
}

// Micro-batch forward in `slot`: the stage's input (embedded tokens, or the
// previous stage's output), its layers, then the loss (last stage; with
// backward its gradient too, as the fused head does) or the send onward.
// (A slot is reused only after its backward, whose receive completed every
// send from it.)
void PipelineParallel::forward(int64_t slot, const Tensor& tokens, const Tensor& targets,
                               bool backward, float grad_scale, double& loss) {
  Activations& a = *acts_[size_t(slot)];
  if (stage_ == 0)
    model_.embed_forward(a, tokens);
  else
    receive(a.residual(first_), int(stage_ - 1), kForwardTag);
  model_.blocks_forward(a, first_, last_);
  if (stage_ == stages_ - 1)
    loss += model_.head_loss(a, targets, backward, grad_scale);
  else
    sending_.push_back(pp_.send_async(a.residual(last_), int(stage_ + 1), kForwardTag));
}

// Micro-batch backward in `slot`: the gradient of the stage's output (from
// the loss, or received from the next stage) back through its layers, then
// into the embedding (first stage) or sent to the previous stage.
void PipelineParallel::backward(int64_t slot, const Tensor& tokens) {
  Activations& a = *acts_[size_t(slot)];
  if (stage_ < stages_ - 1) receive(a.residual_grad(), int(stage_ + 1), kBackwardTag);
  model_.blocks_backward(a, first_, last_);
  if (stage_ == 0)
    model_.embed_backward(a, tokens);
  else
    sending_.push_back(pp_.send_async(a.residual_grad(), int(stage_ - 1), kBackwardTag));
}

double PipelineParallel::from_last_stage(double v) {
  Tensor t = Tensor::empty({1}, DType::F64);
  *t.data<double>() = stage_ == stages_ - 1 ? v : 0.0;
  pp_.all_reduce(t);
  return *t.data<double>();
}

double PipelineParallel::forward_backward(const std::vector<Tensor>& tokens,
                                          const std::vector<Tensor>& targets, float grad_scale) {
  const int64_t m = int64_t(tokens.size());
  NK_CHECK(m > 0 && int64_t(targets.size()) == m, "PipelineParallel: {} tokens, {} targets", m,
           targets.size());
  const int64_t P = int64_t(acts_.size());
  const int64_t warmup = std::min(stages_ - stage_ - 1, m);
  double loss = 0;
  for (int64_t i = 0; i < warmup; ++i)
    forward(i % P, tokens[size_t(i)], targets[size_t(i)], true, grad_scale, loss);
  for (int64_t i = 0; i < m - warmup; ++i) {  // steady state: one forward, one backward
    const int64_t j = warmup + i;
    forward(j % P, tokens[size_t(j)], targets[size_t(j)], true, grad_scale, loss);
    backward(i % P, tokens[size_t(i)]);
  }
  for (int64_t i = m - warmup; i < m; ++i) backward(i % P, tokens[size_t(i)]);
  wait_sends();
  WaitTimer timer{wait_s_};  // the loss from the last stage: every stage waits for it
  return from_last_stage(loss);
}

double PipelineParallel::forward_loss(const Tensor& tokens, const Tensor& targets) {
  double loss = 0;
  forward(0, tokens, targets, false, 0.f, loss);
  wait_sends();
  return from_last_stage(loss);
}

void PipelineParallel::reduce_embedding_grads() {
  if (!embedding_ || embedding_->size() < 2 || !model_.config().tied_embeddings) return;
  const ParamInfo& p = model_.layout().find("wte");
  if (p.trainable) embedding_->all_reduce(ParamLayout::view(model_.grads(), p));
}

bool PipelineParallel::counts_in_norm(const ParamInfo& p) const {
  return !(p.name == "wte" && !model_.stage().embedding);
}

}  // namespace nk::parallel
