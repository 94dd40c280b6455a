// SteerLM's attribute-labelled data (NeMo-Aligner's regression reward model,
// HelpSteer's columns): one JSONL record per response,
//
//   {"prompt": "..." | [messages], "response": "..." | [messages],
//    "helpfulness": 3, "correctness": 4, ...}
//
// each named attribute a number, or null / absent when unlabelled (left out
// of the loss, NeMo-Aligner's -100). The prompt and response are rendered
// as preference training renders a prompt and a chosen completion
// (render_sequence), so an attribute model scores what it was trained on.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "align/preference_data.h"
#include "data/dataset/epoch_order.h"
#include "data/dataset/sample_dataset.h"

namespace nk {

struct AttributeData {
  std::string path;
  std::vector<std::string> attributes;
  std::vector<std::vector<int32_t>> tokens;  // per record: prompt and response
  std::vector<std::vector<float>> values;    // per record: [attributes], NaN when unlabelled
  std::vector<int64_t> line;                 // per record: its line in `path`
  int64_t truncated = 0;                     // records whose beginning was cut
  int64_t records() const { return int64_t(line.size()); }
  std::string summary() const;
};

// Every record of `path` (plain or zstd). A sequence longer than max_length
// keeps its last max_length tokens (the score is read at the last one),
// counted. nk::Error naming PATH:LINE and the key for a record that is not
// an object, a missing or mistyped prompt or response, an attribute that is
// not a finite number (or null), a record with no attribute labelled, or no
// record at all.
AttributeData read_attribute_jsonl(const std::string& path, const PreferenceRenderer& r,
                                   const std::vector<std::string>& attributes, int64_t max_length,
                                   const std::string& prompt_key, const std::string& response_key);

// The records as rows of seq_len tokens, one per row, padded (targets all
// -100: the loss is on the scores): sample i is record order[i % n] of epoch
// i / n, shuffled by (seed, epoch) or in file order.
class AttributeDataset : public SampleDataset {
 public:
  AttributeDataset(std::shared_ptr<const AttributeData> data, int64_t seq_len, int32_t pad_id,
                   uint64_t seed, bool shuffle, std::string name);
  int64_t size() const override { return INT64_MAX; }
  int64_t seq_len() const override { return seq_len_; }
  void sample(int64_t, int32_t*) const override;  // rows only: an internal error
  std::string name() const override { return name_; }
  std::string describe(int64_t i) const override;
  int64_t max_segments() const override { return 1; }
  void row(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions,
           int32_t* cu_seqlens) const override;
  // The record sample i is.
  int64_t record_of(int64_t i) const;
  const AttributeData& data() const { return *data_; }

 private:
  std::shared_ptr<const AttributeData> data_;
  int64_t seq_len_;
  int32_t pad_;
  std::string name_;
  EpochOrder order_;
};

}  // namespace nk
