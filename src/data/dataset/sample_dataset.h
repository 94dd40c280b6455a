// A dataset of fixed-length training samples: what a loader draws batches from.
// Sample i is seq_len + 1 consecutive tokens (inputs are the first seq_len,
// targets the last seq_len), and depends only on i, so a loader that restores
// its sample counter continues exactly where an uninterrupted run would be.
#pragma once
#include <cstdint>
#include <string>

namespace nk {

class SampleDataset {
 public:
  virtual ~SampleDataset() = default;
  virtual int64_t size() const = 0;     // number of samples
  virtual int64_t seq_len() const = 0;  // a sample holds seq_len + 1 tokens
  // Fills out[0 .. seq_len] with sample i, 0 <= i < size().
  virtual void sample(int64_t i, int32_t* out) const = 0;
  // What this is, for messages: "indexed dataset 'x' (train split)".
  virtual std::string name() const = 0;
  // Where sample i comes from, for error messages.
  virtual std::string describe(int64_t i) const { return name() + ", sample " + std::to_string(i); }
};

}  // namespace nk
