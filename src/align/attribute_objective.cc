#include "align/attribute_objective.h"

#include <cmath>

namespace nk {

AttributeObjective::AttributeObjective(const TrainConfig& cfg,
                                       std::shared_ptr<const AttributeData> train,
                                       std::shared_ptr<const AttributeData> valid, int32_t pad_id,
                                       bool shuffle)
    : cfg_(cfg), train_data_(std::move(train)), valid_data_(std::move(valid)) {
  const size_t n = train_data_->attributes.size();
  NK_CHECK(cfg_.model.num_labels == int64_t(n), "AttributeObjective: {} labels for {} attributes",
           cfg_.model.num_labels, n);
  train_ = std::make_shared<AttributeDataset>(train_data_, cfg_.seq_len, pad_id, cfg_.seed, shuffle,
                                              fmt::format("'{}' (train)", train_data_->path));
  if (valid_data_)
    valid_ = std::make_shared<AttributeDataset>(valid_data_, cfg_.seq_len, pad_id, cfg_.seed, false,
                                                fmt::format("'{}' (valid)", valid_data_->path));
  for (Sums* s : {&train_sums_, &eval_sums_})
    *s = Sums{std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
}

TrainData AttributeObjective::data(const TrainConfig&) {
  TrainData d;
  d.train = train_;
  d.valid = valid_;
  d.summary =
      fmt::format("align.method=rm, align.reward_model_type=regression; {}{}",
                  train_data_->summary(), valid_data_ ? "; valid " + valid_data_->summary() : "");
  return d;
}

double AttributeObjective::head_micro_batch(Transformer& model, Activations& a,
                                            const MicroBatch& batch, float grad_scale, bool train) {
  const AttributeDataset& ds = train ? *train_ : *valid_;
  const AttributeData& d = ds.data();
  const int64_t B = a.B, n = int64_t(d.attributes.size());
  std::vector<int64_t> last(static_cast<size_t>(B));
  std::vector<const std::vector<float>*> y(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t r = ds.record_of(batch.first_sample + b);
    last[size_t(b)] = int64_t(d.tokens[size_t(r)].size()) - 1;
    y[size_t(b)] = &d.values[size_t(r)];
  }
  std::vector<float> s(static_cast<size_t>(B * n)), ds_(static_cast<size_t>(B * n), 0.f);
  score_rows(model, a, batch, last, s);
  double count = 0, sum = 0;
  Sums& sums = train ? train_sums_ : eval_sums_;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < n; ++j) {
      const float want = (*y[size_t(b)])[size_t(j)];
      if (std::isnan(want)) continue;
      const double e = double(s[size_t(b * n + j)]) - double(want);
      sum += e * e;
      count += 1;
      sums.squared[size_t(j)] += e * e;
      sums.count[size_t(j)] += 1;
    }
  if (train) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < n; ++j) {
        const float want = (*y[size_t(b)])[size_t(j)];
        if (!std::isnan(want))
          ds_[size_t(b * n + j)] =
              float(2 * (double(s[size_t(b * n + j)]) - double(want)) / count * grad_scale);
      }
    model.score_backward(a, last, ds_, moe_grad_scale(grad_scale));
  }
  // Context parallel: every cp rank has the whole loss; the Trainer sums
  // the ranks'.
  return (count > 0 ? sum / count / double(ranks_.cp) : 0.0) + (train ? moe_loss(model, a) : 0.0);
}

double AttributeObjective::train_micro_batch(Transformer& model, Activations& a,
                                             const MicroBatch& batch, float grad_scale) {
  return whole_micro_batch(model, a, batch, true,
                           [&] { return head_micro_batch(model, a, batch, grad_scale, true); });
}

double AttributeObjective::eval_micro_batch(Transformer& model, Activations& a,
                                            const MicroBatch& batch) {
  return whole_micro_batch(model, a, batch, false,
                           [&] { return head_micro_batch(model, a, batch, 0.f, false); });
}

ObjectiveMetrics AttributeObjective::take_metrics(bool eval) {
  Sums& s = eval ? eval_sums_ : train_sums_;
  const size_t n = s.squared.size();
  {  // data parallel: every rank's micro-batches; pipeline parallel: the last stage's
    std::vector<double> v = s.squared;
    v.insert(v.end(), s.count.begin(), s.count.end());
    sum_figures(v, eval);
    std::copy(v.begin(), v.begin() + int64_t(n), s.squared.begin());
    std::copy(v.begin() + int64_t(n), v.end(), s.count.begin());
  }
  ObjectiveMetrics m;
  double sq = 0, c = 0;
  for (size_t j = 0; j < n; ++j) {
    sq += s.squared[j];
    c += s.count[j];
  }
  if (c == 0) return m;
  m.emplace_back("mse", sq / c);
  for (size_t j = 0; j < n; ++j)
    m.emplace_back("mse/" + train_data_->attributes[j],
                   s.count[j] > 0 ? s.squared[j] / s.count[j] : NAN);
  std::fill(s.squared.begin(), s.squared.end(), 0.0);
  std::fill(s.count.begin(), s.count.end(), 0.0);
  return m;
}

}  // namespace nk
