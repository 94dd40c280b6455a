// Training a fastText document classifier (a quality classifier as in GPT-3,
// NeMo Curator and DCLM) from labelled JSONL, for the `classifier` stage.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace nk::curate {

struct ClassifierTrainOptions {
  std::string input;   // JSONL, plain or zstd-compressed
  std::string output;  // the model, written atomically
  std::string text_key = "text";
  std::string label_key = "label";  // a string or a number; "__label__" is added
  // fastText settings; the rest are those of `fasttext supervised`.
  int epoch = 5;
  double lr = 0.1;
  int word_ngrams = 2;
  int dim = 100;
  int min_count = 1;
  int64_t bucket = 2'000'000;  // hashed word n-gram rows (unused when word_ngrams is 1)
  // 1 keeps training reproducible bit for bit; more threads train faster
  // (fastText's lock-free updates) but not reproducibly.
  int threads = 1;
  double valid_fraction = 0.1;  // held out by a hash of the text
  uint64_t seed = 1;            // of the split and of fastText
};

struct LabelMetrics {
  std::string label;                                // without "__label__"
  int64_t support = 0, predicted = 0, correct = 0;  // on the held-out set
  double precision = 0, recall = 0, f1 = 0;
};

struct ClassifierTrainReport {
  int64_t train_docs = 0, valid_docs = 0;
  std::vector<std::pair<std::string, int64_t>> train_label_counts;  // sorted by label
  std::vector<LabelMetrics> metrics;  // per label, on the held-out set (empty when none)
  double accuracy = 0;                // top-1 on the held-out set
  double seconds = 0;                 // training time
};

// Reads opts.input, holds out a deterministic opts.valid_fraction, trains,
// writes opts.output (temp file + rename: nothing is left on failure) and
// evaluates on the held-out part. nk::Error naming FILE:LINE for a malformed
// line, a missing or non-text field, or a label with whitespace; naming the
// file when it has fewer than two labels.
ClassifierTrainReport train_quality_classifier(const ClassifierTrainOptions& opts);

// The report as a table, for the CLI.
std::string format_train_report(const ClassifierTrainOptions& opts, const ClassifierTrainReport& r);

}  // namespace nk::curate
