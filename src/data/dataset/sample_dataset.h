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

  // ---- rows (fine-tuning) ----
  // A dataset of rows rather than windows: each sample is a row of seq_len
  // tokens with its own targets (prompts and padding ignored, -100) and
  // document boundaries (several samples packed into a row, attention and
  // positions restarting at each). Such a dataset returns the most segments
  // in any row (> 0) and fills row(); sample() is not used.
  virtual int64_t max_segments() const { return 0; }
  // tokens, targets, positions: seq_len each; cu_seqlens: max_segments() + 1
  // segment starts, the last ones repeating seq_len (ops::attention_forward).
  virtual void row(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions,
                   int32_t* cu_seqlens) const {}
};

}  // namespace nk
