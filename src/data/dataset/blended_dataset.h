// Megatron-Core's BlendedDataset: samples drawn from several datasets in given
// proportions. Sample i comes from dataset dataset_index()[i], as that
// dataset's sample dataset_sample_index()[i]; the indices follow Megatron's
// greedy rule (helpers.cpp build_blending_indices): sample i goes to the
// dataset d that maximises weight[d] * max(i, 1) - count[d] (ties to the lowest
// d), so every prefix of the blend is as close to the weights as it can be.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/dataset/index_cache.h"
#include "data/dataset/sample_dataset.h"

namespace nk {

// NeMo's blend: weight, prefix, weight, prefix, ... Weights are normalised to sum to 1.
struct BlendSpec {
  std::vector<double> weights;
  std::vector<std::string> prefixes;
};
// "0.3,path1,0.7,path2" (the command-line and YAML-list forms). nk::Error naming
// `key` for an odd number of items, a weight that is not a non-negative number,
// an empty prefix, or weights summing to zero.
BlendSpec parse_blend(const std::string& text, const std::string& key);

// Samples each member must provide for `total` blended samples: Megatron's
// ceil(weight * total * 1.005), the margin keeping the greedy rule in range.
int64_t blend_member_samples(double weight, int64_t total);

// Megatron's greedy blending (see above), for `size` samples.
void build_blending_indices(const std::vector<double>& weights, int64_t size,
                            std::vector<int16_t>& dataset_index,
                            std::vector<int64_t>& dataset_sample_index);

class BlendedDataset : public SampleDataset {
 public:
  // weights: normalised here. member_ids: a line per member naming what
  // defines it (a cache hash), for this blend's cache description. cache_dir:
  // "" keeps the blending indices in memory only. nk::Error if a member holds
  // fewer samples than the blend draws from it, or the members' seq_len differ.
  BlendedDataset(std::vector<std::shared_ptr<const SampleDataset>> members,
                 std::vector<double> weights, int64_t size, const std::string& cache_dir,
                 const std::string& kind, const std::vector<std::string>& member_ids);

  int64_t size() const override { return int64_t(dataset_index_.size()); }
  int64_t seq_len() const override { return members_[0]->seq_len(); }
  void sample(int64_t i, int32_t* out) const override;
  std::string name() const override;
  std::string describe(int64_t i) const override;

  const std::vector<double>& weights() const { return weights_; }
  const std::vector<int16_t>& dataset_index() const { return dataset_index_; }
  const std::vector<int64_t>& dataset_sample_index() const { return dataset_sample_index_; }
  const SampleDataset& member(size_t d) const { return *members_[d]; }
  bool loaded_from_cache() const { return loaded_from_cache_; }

 private:
  std::vector<std::shared_ptr<const SampleDataset>> members_;
  std::vector<double> weights_;
  std::vector<int16_t> dataset_index_;
  std::vector<int64_t> dataset_sample_index_;
  bool loaded_from_cache_ = false;
};

}  // namespace nk
