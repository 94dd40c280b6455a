#include "data/dataset/blended_dataset.h"

#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "core/log.h"
#include "core/strings.h"

namespace nk {

BlendSpec parse_blend(const std::string& text, const std::string& key) {
  std::vector<std::string> items;
  size_t at = 0;
  while (true) {
    size_t comma = text.find(',', at);
    items.push_back(trim(text.substr(at, comma == std::string::npos ? comma : comma - at)));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (items.size() % 2)
    fail("{}: {} items in '{}'; expected pairs of weight,prefix (e.g. 0.3,path1,0.7,path2)", key,
         items.size(), text);
  BlendSpec b;
  double sum = 0;
  for (size_t i = 0; i < items.size(); i += 2) {
    char* end = nullptr;
    double w = items[i].empty() ? NAN : std::strtod(items[i].c_str(), &end);
    if (items[i].empty() || *end != '\0' || !std::isfinite(w))
      fail("{}: item {} ('{}') should be a weight (a number)", key, i + 1, items[i]);
    if (w < 0) fail("{}: weight {} of '{}' is negative", key, w, items[i + 1]);
    if (items[i + 1].empty()) fail("{}: item {} (a dataset prefix) is empty", key, i + 2);
    b.weights.push_back(w);
    b.prefixes.push_back(items[i + 1]);
    sum += w;
  }
  if (!(sum > 0)) fail("{}: the weights sum to zero", key);
  if (b.weights.size() > 32767) fail("{}: more than 32767 datasets", key);
  for (double& w : b.weights) w /= sum;
  return b;
}

int64_t blend_member_samples(double weight, int64_t total) {
  return int64_t(std::ceil(weight * double(total) * 1.005));
}

void build_blending_indices(const std::vector<double>& weights, int64_t size,
                            std::vector<int16_t>& dataset_index,
                            std::vector<int64_t>& dataset_sample_index) {
  size_t n = weights.size();
  NK_CHECK(n > 0 && n <= 32767, "{} datasets", n);
  dataset_index.resize(size_t(size));
  dataset_sample_index.resize(size_t(size));
  std::vector<int64_t> count(n, 0);
  for (int64_t i = 0; i < size; ++i) {
    double at = double(std::max<int64_t>(i, 1));
    size_t best = 0;
    double best_err = weights[0] * at - double(count[0]);
    for (size_t d = 1; d < n; ++d) {
      double err = weights[d] * at - double(count[d]);
      if (err > best_err) best = d, best_err = err;
    }
    dataset_index[size_t(i)] = int16_t(best);
    dataset_sample_index[size_t(i)] = count[best]++;
  }
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const SampleDataset>> members,
                               std::vector<double> weights, int64_t size,
                               const std::string& cache_dir, const std::string& kind,
                               const std::vector<std::string>& member_ids)
    : members_(std::move(members)), weights_(std::move(weights)) {
  NK_CHECK(!members_.empty() && members_.size() == weights_.size() &&
               member_ids.size() == members_.size(),
           "blend of {} datasets, {} weights", members_.size(), weights_.size());
  if (size <= 0) fail("blend: size must be positive, got {}", size);
  double sum = 0;
  for (double w : weights_) {
    if (!(w >= 0)) fail("blend: negative weight {}", w);
    sum += w;
  }
  if (!(sum > 0)) fail("blend: the weights sum to zero");
  for (double& w : weights_) w /= sum;
  for (const auto& m : members_)
    if (m->seq_len() != members_[0]->seq_len())
      fail("blend: {} has seq_len {}, {} has {}", m->name(), m->seq_len(), members_[0]->name(),
           members_[0]->seq_len());

  std::string description =
      fmt::format("{{\"class\": \"BlendedDataset\", \"format\": 1, \"size\": {}", size);
  for (size_t d = 0; d < members_.size(); ++d)
    description += fmt::format(", \"dataset_{}\": {{\"weight\": {}, \"id\": \"{}\"}}", d,
                               weights_[d], member_ids[d]);
  description += "}";
  IndexCache cache(cache_dir, kind, description);
  loaded_from_cache_ = cache.load("dataset_index", dataset_index_) &&
                       cache.load("dataset_sample_index", dataset_sample_index_) &&
                       int64_t(dataset_index_.size()) == size &&
                       dataset_sample_index_.size() == dataset_index_.size();
  std::vector<int64_t> count(members_.size(), 0);
  for (size_t i = 0; loaded_from_cache_ && i < dataset_index_.size(); ++i) {
    size_t d = size_t(dataset_index_[i]);
    loaded_from_cache_ = d < members_.size() && dataset_sample_index_[i] == count[d]++;
  }
  if (!loaded_from_cache_) {
    build_blending_indices(weights_, size, dataset_index_, dataset_sample_index_);
    cache.save("dataset_index", dataset_index_);
    cache.save("dataset_sample_index", dataset_sample_index_);
    std::fill(count.begin(), count.end(), 0);
    for (int16_t d : dataset_index_) ++count[size_t(d)];
  }
  for (size_t d = 0; d < members_.size(); ++d)
    if (count[d] > members_[d]->size())
      fail("blend: {} samples drawn from {}, which holds only {}", count[d], members_[d]->name(),
           members_[d]->size());
}

void BlendedDataset::sample(int64_t i, int32_t* out) const {
  NK_CHECK(i >= 0 && i < size(), "blended sample {} of {}", i, size());
  members_[size_t(dataset_index_[size_t(i)])]->sample(dataset_sample_index_[size_t(i)], out);
}

std::string BlendedDataset::name() const {
  return fmt::format("blend of {} datasets", members_.size());
}

std::string BlendedDataset::describe(int64_t i) const {
  return members_[size_t(dataset_index_[size_t(i)])]->describe(dataset_sample_index_[size_t(i)]) +
         fmt::format(" (blended sample {})", i);
}

}  // namespace nk
