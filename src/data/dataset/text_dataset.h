// A plain-text corpus tokenized into memory, and a loader of random windows
// from it: the data path of the quickstart (no preprocessing step needed).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "data/dataset/sample_dataset.h"
#include "data/utf8.h"  // find_invalid_utf8, used by the loaders

namespace nk {

// The first max_bytes bytes (0 = all) of a plain, .gz or dictzip .dz file, cut
// back to a UTF-8 character boundary; not validated. nk::Error naming the file.
std::string read_text_file(const std::string& path, int64_t max_bytes = 0);

// Byte-tokenized text split into train and validation token streams.
struct TextCorpus {
  std::vector<int32_t> train, val;  // val is the last val_fraction of the tokens
  // max_bytes: 0 reads the whole file; otherwise only the first max_bytes, cut
  // back to a UTF-8 character boundary. nk::Error naming the file for a missing,
  // unreadable or empty file and for invalid UTF-8 (with its byte offset).
  // With replace_invalid, each maximal invalid subpart becomes U+FFFD instead
  // (counted in `replaced`), as Python's errors="replace" does.
  static TextCorpus load(const std::string& path, double val_fraction, int64_t max_bytes,
                         bool replace_invalid = false);
  int64_t replaced = 0;
};

// Deterministic random windows: sample i of a run with seed s starts at
// hash(s, i) % (n - T). A sample depends only on (seed, i), so restoring
// consumed() after a restart continues with exactly the same batches.
class TokenLoader {
 public:
  // `tokens` must outlive the loader. nk::Error if it holds fewer than T+1 tokens.
  TokenLoader(const std::vector<int32_t>* tokens, int64_t B, int64_t T, uint64_t seed);
  // inputs, targets: i32[B, T] contiguous CPU; targets[b, t] = inputs[b, t+1]
  // within the same window (the token after the window for t = T-1).
  void next(Tensor inputs, Tensor targets);
  uint64_t consumed() const { return consumed_; }  // samples (not batches) so far
  void set_consumed(uint64_t n) { consumed_ = n; }
  // Start offset of sample i (exposed for tests and for resume checks).
  int64_t window_start(uint64_t i) const;

 private:
  const std::vector<int32_t>* tokens_;
  int64_t B_, T_;
  uint64_t seed_;
  uint64_t consumed_ = 0;
};

// TokenLoader's windows as a SampleDataset, for DataLoader: sample i is the
// T + 1 tokens at TokenLoader's window_start(i), for any i below size().
class TextWindowDataset : public SampleDataset {
 public:
  // nk::Error naming `name` if `tokens` holds fewer than T + 1 tokens.
  TextWindowDataset(std::shared_ptr<const std::vector<int32_t>> tokens, int64_t T, uint64_t seed,
                    std::string name);
  int64_t size() const override { return INT64_MAX; }  // windows repeat; never runs out
  int64_t seq_len() const override { return T_; }
  void sample(int64_t i, int32_t* out) const override;
  std::string name() const override { return name_; }

 private:
  std::shared_ptr<const std::vector<int32_t>> tokens_;
  int64_t T_;
  uint64_t seed_;
  std::string name_;
};

}  // namespace nk
