// Megatron-Core's GPTDataset over one indexed dataset: the documents of one
// split, tiled over as many epochs as num_samples needs and shuffled, cut into
// overlapping samples of seq_len + 1 tokens (a sample may span documents),
// then the samples shuffled. The three indices are built once and cached (see
// index_cache.h) under a hash of every setting that defines them.
//
// A document is the tokens of all its sequences (IndexedDataset::doc_idx), so
// for the usual one-sequence-per-document data this is Megatron's unit exactly.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/dataset/gpt_indices.h"
#include "data/dataset/index_cache.h"
#include "data/dataset/indexed_dataset.h"
#include "data/dataset/sample_dataset.h"

namespace nk {

struct GPTDatasetConfig {
  std::string split = "969,30,1";  // train,valid,test weights over documents
  DataSplit which = DataSplit::Train;
  int64_t seq_len = 0;      // tokens per sample, plus one for the shifted target
  int64_t num_samples = 0;  // at least this many samples (the last epoch fills the rest)
  uint64_t seed = 0;
  // Folder of the cached indices; "" = PREFIX's folder + "/cache".
  std::string cache_dir;
};

class GPTDataset : public SampleDataset {
 public:
  // nk::Error naming the prefix for a split without documents, a split with
  // fewer than seq_len + 1 tokens, or settings out of range.
  GPTDataset(std::shared_ptr<const IndexedDataset> data, const GPTDatasetConfig& cfg);

  int64_t size() const override { return int64_t(shuffle_index_.size()); }
  int64_t seq_len() const override { return cfg_.seq_len; }
  void sample(int64_t i, int32_t* out) const override;
  std::string name() const override;

  const IndexedDataset& data() const { return *data_; }
  const GPTDatasetConfig& config() const { return cfg_; }
  int64_t doc_begin() const { return doc_begin_; }  // the split's documents [begin, end)
  int64_t doc_end() const { return doc_end_; }
  int64_t tokens_per_epoch() const { return tokens_per_epoch_; }
  int64_t num_epochs() const { return num_epochs_; }
  bool separate_final_epoch() const { return separate_final_epoch_; }
  // Document ids, the split tiled num_epochs times and shuffled.
  const std::vector<int64_t>& document_index() const { return document_index_; }
  // (samples + 1) flattened pairs (position in document_index, token offset).
  const std::vector<int64_t>& sample_index() const { return sample_index_; }
  // Dataset sample i is unshuffled sample shuffle_index()[i].
  const std::vector<int64_t>& shuffle_index() const { return shuffle_index_; }
  // Sample j of the unshuffled order (sample(i) = unshuffled_sample(shuffle_index()[i])).
  void unshuffled_sample(int64_t j, int32_t* out) const;
  int64_t document_length(int64_t doc) const { return doc_lengths_[size_t(doc)]; }
  bool loaded_from_cache() const { return loaded_from_cache_; }
  const IndexCache& cache() const { return *cache_; }

 private:
  void read_document(int64_t doc, int64_t start, int64_t count, int32_t* out) const;
  void build_indices();
  bool indices_consistent() const;

  std::shared_ptr<const IndexedDataset> data_;
  GPTDatasetConfig cfg_;
  std::vector<int64_t> doc_lengths_;  // tokens per document of the whole indexed dataset
  int64_t doc_begin_ = 0, doc_end_ = 0, tokens_per_epoch_ = 0, num_epochs_ = 0;
  int64_t num_samples_built_ = 0;
  bool separate_final_epoch_ = false, loaded_from_cache_ = false;
  std::vector<int64_t> document_index_, sample_index_, shuffle_index_;
  std::unique_ptr<IndexCache> cache_;
};

}  // namespace nk
