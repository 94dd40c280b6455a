// Batches from a SampleDataset in order: micro-batch k holds samples
// consumed, consumed+1, ... (any shuffling is already in the dataset's index).
// The only state is the sample counter, so restoring consumed_samples() in a
// fresh loader over the same dataset continues with exactly the batches an
// uninterrupted loader would have produced.
#pragma once
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "data/dataset/sample_dataset.h"

namespace nk {

class DataLoader {
 public:
  // vocab_size > 0: every token must be in [0, vocab_size), checked per sample
  // (nk::Error naming the dataset, sample and token).
  DataLoader(std::shared_ptr<const SampleDataset> data, int64_t micro_batch,
             int64_t vocab_size = 0);
  // inputs, targets: i32[B, T] contiguous CPU, T = seq_len; targets[b, t] =
  // inputs[b, t+1] within the sample (the sample's extra token for t = T-1).
  // nk::Error when the dataset has no samples left.
  // A dataset of rows (SampleDataset::max_segments() > 0) gives each row's
  // own targets, and fills `positions` i32[B, T] and `cu_seqlens`
  // i32[B, max_segments() + 1] (the model's PackedBatchInfo) when defined.
  void next(Tensor inputs, Tensor targets, Tensor positions = {}, Tensor cu_seqlens = {});
  bool rows() const { return data_->max_segments() > 0; }
  static constexpr int32_t kIgnoreTarget = -100;  // a target the loss skips
  int64_t consumed_samples() const { return consumed_; }
  void set_consumed_samples(int64_t n);
  int64_t micro_batch() const { return B_; }
  const SampleDataset& data() const { return *data_; }

 private:
  std::shared_ptr<const SampleDataset> data_;
  int64_t B_, vocab_;
  int64_t consumed_ = 0;
  std::vector<int32_t> buf_;  // one sample, seq_len + 1 tokens
};

}  // namespace nk
