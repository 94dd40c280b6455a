#include "align/preference_objective.h"

#include "core/log.h"

namespace nk {

PreferenceObjective::PreferenceObjective(const TrainConfig& cfg, const AlignConfig& align,
                                         std::shared_ptr<const PreferenceData> train,
                                         std::shared_ptr<const PreferenceData> valid,
                                         int32_t pad_id)
    : cfg_(cfg), align_(align), train_data_(std::move(train)), valid_data_(std::move(valid)) {
  NK_CHECK(cfg_.micro_batch % 2 == 0, "PreferenceObjective: an odd micro-batch of {}",
           cfg_.micro_batch);
  train_ = std::make_shared<PreferenceDataset>(train_data_, cfg_.seq_len, pad_id, cfg_.seed,
                                               align_.shuffle,
                                               fmt::format("'{}' (train)", train_data_->path));
  if (valid_data_)
    valid_ =
        std::make_shared<PreferenceDataset>(valid_data_, cfg_.seq_len, pad_id, cfg_.seed, false,
                                            fmt::format("'{}' (valid)", valid_data_->path));
}

TrainData PreferenceObjective::data(const TrainConfig&) {
  TrainData d;
  d.train = train_;
  d.valid = valid_;
  d.summary = fmt::format("align.method={}; {}{}", align_.method, train_data_->summary(),
                          valid_data_ ? "; valid " + valid_data_->summary() : "");
  return d;
}

void PreferenceObjective::prepare(Transformer& model, bool fresh) {
  if (!align_.loss.needs_reference()) {
    NK_INFO("align: {} needs no reference model", align_.method);
    return;
  }
  switch (align_.reference_source) {
    case ReferenceSource::AdapterOff:
      NK_INFO("align: reference = the policy with its adapters switched off (its base)");
      return;
    case ReferenceSource::Copy:
      ref_model_ = initial_model(cfg_, true);
      NK_INFO("align: reference = a frozen copy of the initial model ({:.1f} MiB of weights)",
              double(ref_model_->weight_bytes()) / 1048576.0);
      return;
    case ReferenceSource::Precompute:
      break;
  }
  const std::string path = reference_logps_path(cfg_);
  const std::string key = reference_key(cfg_, *train_data_, valid_data_.get());
  if (std::optional<ReferenceLogps> r = load_reference_logps(path); r && r->key == key) {
    NK_CHECK(r->train.size() == train_data_->tokens.size() &&
                 r->valid.size() == (valid_data_ ? valid_data_->tokens.size() : 0),
             "{}: the key matches but the counts do not", path);
    ref_train_ = std::move(r->train);
    ref_valid_ = std::move(r->valid);
    NK_INFO("align: reusing the reference log-probabilities of {} sequences in {}",
            ref_train_.size() + ref_valid_.size(), path);
    return;
  }
  // Not yet computed (or for other data or another model): a fresh run's
  // policy is the initial model; a resumed one builds that model again
  // (whole, on every rank). A fresh policy in pieces over the ranks (a
  // pipeline stage, FSDP's shards) runs through its distributed forward.
  const bool pieces = fresh && !ranks_.whole_model;
  NK_CHECK(!pieces || ranks_.row_nll,
           "PreferenceObjective: a model in pieces without a distributed forward");
  std::unique_ptr<Transformer> initial;
  if (!fresh) initial = initial_model(cfg_, true);  // whole rows by itself
  Transformer& ref = fresh ? model : *initial;
  NK_INFO("align: precomputing the reference log-probabilities of {} sequences{}",
          train_data_->tokens.size() + (valid_data_ ? valid_data_->tokens.size() : 0),
          !fresh   ? " with the initial model rebuilt"
          : pieces ? " through the model's pieces on the ranks"
                   : "");
  const auto logps = [&](const PreferenceDataset& d) {
    return pieces ? compute_sequence_logps(d, cfg_.micro_batch, model.device(), ranks_.row_nll)
                  : compute_sequence_logps(ref, d, cfg_.micro_batch);
  };
  const bool adapters_on = ref.adapters_enabled();
  ReferenceLogps r;
  r.key = key;
  r.train = logps(*train_);
  if (valid_) r.valid = logps(*valid_);
  ref.set_adapters_enabled(adapters_on);
  // Data parallel: every rank computes every sequence alike; rank 0 keeps them.
  if (ranks_.writes) save_reference_logps(path, r);
  ref_train_ = std::move(r.train);
  ref_valid_ = std::move(r.valid);
  computed_reference_ = true;
  NK_INFO("align: reference log-probabilities saved in {}", path);
}

double PreferenceObjective::run(Transformer& model, Activations& a, const MicroBatch& batch,
                                float grad_scale, bool train) {
  std::vector<double> ref_logp;
  if (adapter_off_reference()) {
    // Before the policy's forward, whose activations the backward reads.
    ref_logp.resize(size_t(a.B));
    model.set_adapters_enabled(false);
    sequence_logps(model, a, batch.tokens, batch.targets, ref_logp);
    model.set_adapters_enabled(true);
  }
  return whole_micro_batch(model, a, batch, train, [&] {
    return head(model, a, batch, grad_scale, train, std::move(ref_logp));
  });
}

bool PreferenceObjective::adapter_off_reference() const {
  return align_.loss.needs_reference() && align_.reference_source == ReferenceSource::AdapterOff;
}

void PreferenceObjective::before_staged(Transformer& model, const MicroBatch& batch, bool /*train*/,
                                        const StagedForward& forward) {
  if (!adapter_off_reference()) return;
  // run()'s reference pass, its forward staged (the weights gathered as the
  // policy's are): the base's log-probabilities before the policy's forward.
  std::vector<double> ref(size_t(batch.tokens.dim(0)), 0.0);
  bool head_here = false;  // pipeline parallel: the last stage's alone
  model.set_adapters_enabled(false);
  forward([&](Activations& a) {
    head_here = true;
    model.head_row_nll(a, batch.targets, ref);
    return 0.0;
  });
  model.set_adapters_enabled(true);
  if (!head_here) return;
  ranks_.sum_over_sequence(ref);  // context parallel: the chunks' parts
  for (double& v : ref) v = -v;
  staged_refs_.push_back(std::move(ref));
}

double PreferenceObjective::head_micro_batch(Transformer& model, Activations& a,
                                             const MicroBatch& batch, float grad_scale,
                                             bool train) {
  std::vector<double> ref_logp;
  if (adapter_off_reference()) {
    NK_CHECK(!staged_refs_.empty() && staged_refs_.front().size() == size_t(a.B),
             "PreferenceObjective: align.reference=adapter_off: head_micro_batch without "
             "before_staged");
    ref_logp = std::move(staged_refs_.front());
    staged_refs_.pop_front();
  }
  return head(model, a, batch, grad_scale, train, std::move(ref_logp));
}

double PreferenceObjective::head(Transformer& model, Activations& a, const MicroBatch& batch,
                                 float grad_scale, bool train, std::vector<double> ref_logp) {
  const int64_t B = a.B, T = a.T;
  const PreferenceDataset& ds = train ? *train_ : *valid_;
  // The policy's per-row sums from the forward the caller ran, and each
  // row's completion tokens (context parallel: this rank's chunks' parts,
  // summed over the cp ranks).
  std::vector<double> rows(size_t(2 * B), 0.0);
  model.head_row_nll(a, batch.targets, std::span<double>(rows).first(size_t(B)));
  const int32_t* tg = batch.host_targets.data<int32_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) rows[size_t(B + b)] += tg[b * T + t] != -100;
  ranks_.sum_over_sequence(rows);
  PreferenceBatch pb;
  pb.tokens.resize(size_t(B));
  pb.logp.resize(size_t(B));
  for (int64_t b = 0; b < B; ++b) {
    pb.logp[size_t(b)] = -rows[size_t(b)];
    pb.tokens[size_t(b)] = int64_t(rows[size_t(B + b)]);
  }
  if (align_.loss.method == PreferenceMethod::Kto)
    for (int64_t b = 0; b < B; b += 2)
      pb.desirable.push_back(
          ds.data().desirable[size_t(ds.sequence_of(batch.first_sample + b) / 2)]);
  if (align_.loss.needs_reference()) {
    pb.ref_logp = std::move(ref_logp);
    pb.ref_logp.resize(size_t(B));
    switch (align_.reference_source) {
      case ReferenceSource::Precompute: {
        const std::vector<double>& table = train ? ref_train_ : ref_valid_;
        for (int64_t b = 0; b < B; ++b)
          pb.ref_logp[size_t(b)] = table[size_t(ds.sequence_of(batch.first_sample + b))];
        break;
      }
      case ReferenceSource::AdapterOff:  // run() or before_staged() computed them
        break;
      case ReferenceSource::Copy: {
        // The whole copy reads whole rows (context parallel: every cp rank
        // the same rows, whose chunks it trains).
        const Tensor& tokens = batch.whole_tokens ? *batch.whole_tokens : batch.tokens;
        const Tensor& targets = batch.whole_targets ? *batch.whole_targets : batch.targets;
        const int64_t rows_T = tokens.dim(1);
        if (!ref_acts_ || ref_acts_->B != B || ref_acts_->T != rows_T)
          ref_acts_ = std::make_unique<Activations>(*ref_model_, B, rows_T, false);
        sequence_logps(*ref_model_, *ref_acts_, tokens, targets, pb.ref_logp);
        break;
      }
    }
  }
  const PreferenceLossResult r = preference_loss(align_.loss, pb);
  if (train) {
    // d loss / d (row NLL) = -d loss / d logp, times the loop's scale.
    std::vector<float> scale(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) scale[size_t(b)] = float(-r.dlogp[size_t(b)] * grad_scale);
    model.head_row_backward(a, batch.targets, scale, moe_grad_scale(grad_scale));
  }
  Sums& s = train ? train_sums_ : eval_sums_;
  const PreferenceFigures& f = r.figures;
  s.f.chosen_reward_sum += f.chosen_reward_sum;
  s.f.rejected_reward_sum += f.rejected_reward_sum;
  s.f.chosen_logp_sum += f.chosen_logp_sum;
  s.f.rejected_logp_sum += f.rejected_logp_sum;
  s.f.chosen += f.chosen;
  s.f.rejected += f.rejected;
  s.f.correct += f.correct;
  s.f.kl += f.kl;
  s.f.nll += f.nll;
  s.batches += 1;
  s.pairs += B / 2;
  // Context parallel: every cp rank has the whole loss; the Trainer sums
  // the ranks' (the language model's are their tokens' shares).
  return r.loss / double(ranks_.cp) + (train ? moe_loss(model, a) : 0.0);
}

double PreferenceObjective::train_micro_batch(Transformer& model, Activations& a,
                                              const MicroBatch& batch, float grad_scale) {
  return run(model, a, batch, grad_scale, true);
}

double PreferenceObjective::eval_micro_batch(Transformer& model, Activations& a,
                                             const MicroBatch& batch) {
  return run(model, a, batch, 0.f, false);
}

ObjectiveMetrics PreferenceObjective::take_metrics(bool eval) {
  Sums& s = eval ? eval_sums_ : train_sums_;
  {
    // Data parallel: the sums of every rank's micro-batches (the validation
    // ones are every rank's alike); pipeline parallel: the last stage's.
    PreferenceFigures& f = s.f;
    std::vector<double> v = {f.chosen_reward_sum,
                             f.rejected_reward_sum,
                             f.chosen_logp_sum,
                             f.rejected_logp_sum,
                             double(f.chosen),
                             double(f.rejected),
                             f.correct,
                             f.kl,
                             f.nll,
                             double(s.batches),
                             double(s.pairs)};
    sum_figures(v, eval);
    f.chosen_reward_sum = v[0];
    f.rejected_reward_sum = v[1];
    f.chosen_logp_sum = v[2];
    f.rejected_logp_sum = v[3];
    f.chosen = int64_t(v[4]);
    f.rejected = int64_t(v[5]);
    f.correct = v[6];
    f.kl = v[7];
    f.nll = v[8];
    s.batches = int64_t(v[9]);
    s.pairs = int64_t(v[10]);
  }
  ObjectiveMetrics m;
  if (s.batches == 0) return m;
  const PreferenceFigures& f = s.f;
  const bool kto = align_.loss.method == PreferenceMethod::Kto;
  auto mean = [](double sum, int64_t n) { return n ? sum / double(n) : NAN; };
  const double chosen = mean(f.chosen_reward_sum, f.chosen),
               rejected = mean(f.rejected_reward_sum, f.rejected);
  m.emplace_back("rewards/chosen", chosen);
  m.emplace_back("rewards/rejected", rejected);
  m.emplace_back("rewards/margins", chosen - rejected);
  if (!kto) m.emplace_back("rewards/accuracies", f.correct / double(s.pairs));
  m.emplace_back("logps/chosen", mean(f.chosen_logp_sum, f.chosen));
  m.emplace_back("logps/rejected", mean(f.rejected_logp_sum, f.rejected));
  if (kto) m.emplace_back("kl", f.kl / double(s.batches));
  const bool nll = align_.loss.method == PreferenceMethod::Orpo ||
                   (align_.loss.method == PreferenceMethod::Dpo && align_.loss.rpo_alpha > 0) ||
                   (align_.loss.method == PreferenceMethod::Simpo && align_.loss.cpo_alpha > 0);
  if (nll) m.emplace_back("nll_loss", f.nll / double(s.batches));
  s = Sums();
  return m;
}

}  // namespace nk
