// A fastText supervised model (language id, quality classifiers) opened for
// prediction. The file is checked in full before fastText reads it: fastText
// trusts every size in the file, so a truncated or corrupt model would make it
// loop forever or allocate without bound. Here such a file is an nk::Error that
// names it and says what is wrong.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fasttext {
class FastText;
}

namespace nk::curate {

// fastText's label prefix: a model's labels and a training line's tags start with it.
inline constexpr std::string_view kLabelPrefix = "__label__";

// The first four bytes of every fastText model (FASTTEXT_FILEFORMAT_MAGIC_INT32).
inline constexpr int32_t kFastTextMagic = 793712314;

struct Prediction {
  std::string label;  // as the model names it, e.g. "__label__en"
  float prob = 0;     // in [0, 1]
};

class FastTextModel {
 public:
  // nk::Error naming `path` when it is missing, unreadable, a folder, not a
  // fastText model, of an unsupported version, truncated or inconsistent, or an
  // unsupervised (word-vector) model.
  explicit FastTextModel(const std::string& path);
  ~FastTextModel();
  FastTextModel(const FastTextModel&) = delete;
  FastTextModel& operator=(const FastTextModel&) = delete;

  // The k most probable labels (all when k < 0) whose probability is at least
  // `threshold`, most probable first. The text is read as fastText's own
  // `predict-prob` and Python predict() read one line: newlines become spaces
  // and the line ends with fastText's end-of-sentence token. Thread-safe:
  // scratch space is per thread. Empty when the text gives fastText no input.
  std::vector<Prediction> predict(std::string_view text, int k = 1, float threshold = 0) const;

  // The probability of label number `label_index` (index into labels()); 0
  // when the text gives fastText no input.
  float label_prob(std::string_view text, int label_index) const;

  const std::string& path() const { return path_; }
  // Every label of the model, in the model's order (most frequent first).
  const std::vector<std::string>& labels() const { return labels_; }
  int label_index(std::string_view label) const;  // -1 when the model has no such label
  int dim() const;
  bool quantized() const;

 private:
  // (log-probability, label index) pairs, as fastText's predict gives them.
  void predict_ids(std::string_view text, int k, float threshold,
                   std::vector<std::pair<float, int>>& out) const;

  std::string path_;
  std::unique_ptr<fasttext::FastText> ft_;
  std::vector<std::string> labels_;
};

// Checks that `path` is a complete, self-consistent fastText supervised model
// (the layout fastText 0.9 writes, format versions 11 and 12) without building
// it. nk::Error naming the file and the first problem found.
void validate_fasttext_file(const std::string& path);

}  // namespace nk::curate
