#include "align/reward_objective.h"

#include "align/reward_loss.h"
#include "core/log.h"

namespace nk {

RewardObjective::RewardObjective(const TrainConfig& cfg, const AlignConfig& align,
                                 std::shared_ptr<const PreferenceData> train,
                                 std::shared_ptr<const PreferenceData> valid, int32_t pad_id)
    : cfg_(cfg), align_(align), train_data_(std::move(train)), valid_data_(std::move(valid)) {
  NK_CHECK(cfg_.micro_batch % 2 == 0, "RewardObjective: an odd micro-batch of {}",
           cfg_.micro_batch);
  NK_CHECK(cfg_.model.num_labels == 1, "RewardObjective: a model of {} labels",
           cfg_.model.num_labels);
  train_ = std::make_shared<PreferenceDataset>(train_data_, cfg_.seq_len, pad_id, cfg_.seed,
                                               align_.shuffle,
                                               fmt::format("'{}' (train)", train_data_->path));
  if (valid_data_)
    valid_ =
        std::make_shared<PreferenceDataset>(valid_data_, cfg_.seq_len, pad_id, cfg_.seed, false,
                                            fmt::format("'{}' (valid)", valid_data_->path));
}

TrainData RewardObjective::data(const TrainConfig&) {
  TrainData d;
  d.train = train_;
  d.valid = valid_;
  d.summary = fmt::format("align.method=rm; {}{}", train_data_->summary(),
                          valid_data_ ? "; valid " + valid_data_->summary() : "");
  return d;
}

double RewardObjective::head_micro_batch(Transformer& model, Activations& a,
                                         const MicroBatch& batch, float grad_scale, bool train) {
  const int64_t B = a.B;
  const PreferenceDataset& ds = train ? *train_ : *valid_;
  const PreferenceData& d = ds.data();
  // Each row's reward is its score at its sequence's last token (a
  // truncated sequence: the row's last position; the whole row's, which
  // context parallelism splits over the ranks).
  std::vector<int64_t> last(static_cast<size_t>(B));
  std::vector<double> margins;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t s = ds.sequence_of(batch.first_sample + b);
    last[size_t(b)] = std::min(int64_t(d.tokens[size_t(s)].size()), cfg_.seq_len) - 1;
    if (b % 2 == 0 && !d.margin.empty()) margins.push_back(d.margin[size_t(s / 2)]);
  }
  std::vector<float> scores(static_cast<size_t>(B));
  score_rows(model, a, batch, last, scores);
  const std::vector<double> rewards(scores.begin(), scores.end());
  const RewardLossResult r = reward_loss(rewards, margins, align_.center_rewards_coefficient);
  if (train) {
    std::vector<float> dscores(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) dscores[size_t(b)] = float(r.dreward[size_t(b)] * grad_scale);
    model.score_backward(a, last, dscores, moe_grad_scale(grad_scale));
  }
  Sums& s = train ? train_sums_ : eval_sums_;
  s.chosen += r.chosen_sum;
  s.rejected += r.rejected_sum;
  s.correct += r.correct;
  s.pairs += r.pairs;
  // Context parallel: every cp rank has the whole loss; the Trainer sums
  // the ranks'.
  return r.loss / double(ranks_.cp) + (train ? moe_loss(model, a) : 0.0);
}

double RewardObjective::train_micro_batch(Transformer& model, Activations& a,
                                          const MicroBatch& batch, float grad_scale) {
  return whole_micro_batch(model, a, batch, true,
                           [&] { return head_micro_batch(model, a, batch, grad_scale, true); });
}

double RewardObjective::eval_micro_batch(Transformer& model, Activations& a,
                                         const MicroBatch& batch) {
  return whole_micro_batch(model, a, batch, false,
                           [&] { return head_micro_batch(model, a, batch, 0.f, false); });
}

ObjectiveMetrics RewardObjective::take_metrics(bool eval) {
  Sums& s = eval ? eval_sums_ : train_sums_;
  {  // data parallel: every rank's micro-batches; pipeline parallel: the last stage's
    std::vector<double> v = {s.chosen, s.rejected, s.correct, double(s.pairs)};
    sum_figures(v, eval);
    s = Sums{v[0], v[1], v[2], int64_t(v[3])};
  }
  ObjectiveMetrics m;
  if (s.pairs == 0) return m;
  const double n = double(s.pairs);
  m.emplace_back("rewards/chosen", s.chosen / n);
  m.emplace_back("rewards/rejected", s.rejected / n);
  m.emplace_back("rewards/margins", (s.chosen - s.rejected) / n);
  m.emplace_back("rewards/accuracies", s.correct / n);
  s = Sums();
  return m;
}

}  // namespace nk
