#include "curate/classify/fasttext_model.h"

#include <fasttext/fasttext.h>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <istream>
#include <streambuf>

#include "core/error.h"

namespace nk::curate {

namespace {

namespace fs = std::filesystem;

// fastText 0.9's Args, model_name and loss_name values as stored in the file.
constexpr int32_t kModelSupervised = 3;
constexpr int32_t kLossMin = 1, kLossMax = 4;  // hs, ns, softmax, ova
constexpr int64_t kCentroidsPerSubquantizer = 256;

// Reads the model file front to back, checking each size against the bytes
// that are left, and skipping the matrices' payloads without reading them.
class ModelFileChecker {
 public:
  explicit ModelFileChecker(const std::string& path) : path_(path) {
    std::error_code ec;
    if (!fs::exists(path, ec)) fail("fastText model '{}': no such file", path);
    if (fs::is_directory(path, ec)) fail("fastText model '{}': is a folder, not a file", path);
    in_.open(path, std::ios::binary);
    if (!in_) fail("fastText model '{}': cannot open: {}", path, std::strerror(errno));
    in_.seekg(0, std::ios::end);
    size_ = int64_t(in_.tellg());
    in_.seekg(0);
    if (size_ < 0 || !in_) fail("fastText model '{}': cannot read", path);
  }

  void check() {
    if (size_ < 8) bad("not a fastText model: {} bytes, too short for the header", size_);
    if (read<int32_t>("magic number") != kFastTextMagic)
      bad("not a fastText model (the file does not start with fastText's magic number)");
    int32_t version = read<int32_t>("version");
    if (version != 11 && version != 12)
      bad("fastText file format version {} is not supported (11 and 12 are)", version);
    check_args();
    check_dictionary();
    bool quant_input = read_bool("quantization flag");
    if (!quant_input && pruneidx_size_ >= 0)
      bad("the vocabulary is pruned but the input matrix is not quantized");
    // Rows the input matrix must have: words, then the hashed n-gram buckets
    // (remapped through the pruning table when pruned).
    int64_t min_rows = nwords_ + (pruneidx_size_ >= 0 ? max_pruned_row_ + 1 : bucket_);
    check_matrix("input", quant_input, min_rows, -1);
    bool qout = read_bool("output quantization flag");
    check_matrix("output", quant_input && qout, nlabels_, nlabels_);
    if (pos() != size_)
      bad("not a fastText model: {} unexpected bytes after the end of the model", size_ - pos());
  }

 private:
  template <class... Args>
  [[noreturn]] void bad(fmt::format_string<Args...> f, Args&&... args) {
    fail("fastText model '{}': {}", path_, fmt::format(f, std::forward<Args>(args)...));
  }

  int64_t pos() { return int64_t(in_.tellg()); }
  int64_t left() { return size_ - pos(); }

  [[noreturn]] void truncated(const char* what) {
    bad("truncated: the file ends inside the {} ({} bytes in all)", what, size_);
  }

  template <class T>
  T read(const char* what) {
    T v{};
    if (left() < int64_t(sizeof(T))) truncated(what);
    in_.read(reinterpret_cast<char*>(&v), sizeof(T));
    if (!in_) truncated(what);
    return v;
  }

  bool read_bool(const char* what) {
    uint8_t b = read<uint8_t>(what);
    if (b > 1) bad("corrupt: the {} is {} (expected 0 or 1) at byte {}", what, b, pos() - 1);
    return b == 1;
  }

  void skip(int64_t bytes, const char* what) {
    if (bytes < 0 || bytes > left()) truncated(what);
    in_.seekg(bytes, std::ios::cur);
  }

  void check_args() {
    dim_ = read<int32_t>("settings");
    read<int32_t>("settings");  // ws
    read<int32_t>("settings");  // epoch
    read<int32_t>("settings");  // minCount
    read<int32_t>("settings");  // neg
    int32_t word_ngrams = read<int32_t>("settings");
    int32_t loss = read<int32_t>("settings");
    int32_t model = read<int32_t>("settings");
    bucket_ = read<int32_t>("settings");
    read<int32_t>("settings");  // minn
    int32_t maxn = read<int32_t>("settings");
    read<int32_t>("settings");  // lrUpdateRate
    read<double>("settings");   // t
    if (dim_ <= 0 || dim_ > (1 << 20)) bad("corrupt: vector dimension {}", dim_);
    if (loss < kLossMin || loss > kLossMax) bad("corrupt: loss type {}", loss);
    if (model < 1 || model > kModelSupervised) bad("corrupt: model type {}", model);
    if (model != kModelSupervised)
      bad("a word-vector (unsupervised) model, not a classifier; it cannot predict labels");
    if (bucket_ < 0) bad("corrupt: bucket count {}", bucket_);
    // fastText takes n-gram hashes modulo the bucket count.
    if (bucket_ == 0 && (maxn > 0 || word_ngrams > 1))
      bad("corrupt: n-grams are enabled but the bucket count is 0");
  }

  void check_dictionary() {
    int32_t size = read<int32_t>("vocabulary");
    nwords_ = read<int32_t>("vocabulary");
    nlabels_ = read<int32_t>("vocabulary");
    read<int64_t>("vocabulary");  // ntokens
    pruneidx_size_ = read<int64_t>("vocabulary");
    if (size < 0 || nwords_ < 0 || nlabels_ < 0 || int64_t(nwords_) + nlabels_ != size)
      bad("corrupt: vocabulary of {} entries with {} words and {} labels", size, nwords_, nlabels_);
    if (nlabels_ == 0) bad("the model has no labels; it cannot predict");
    // Each entry is at least a terminating NUL, an int64 count and a type byte.
    if (int64_t(size) * 10 > left()) truncated("vocabulary");
    std::string word;
    for (int32_t i = 0; i < size; ++i) {
      word.clear();
      for (;;) {
        int c = in_.get();
        if (c == std::char_traits<char>::eof()) truncated("vocabulary");
        if (c == 0) break;
        word.push_back(char(c));
      }
      int64_t count = read<int64_t>("vocabulary");
      int8_t type = read<int8_t>("vocabulary");
      int8_t want = i < nwords_ ? 0 : 1;  // words first, then labels
      if (type != want)
        bad("corrupt: vocabulary entry {} ('{}') has type {}, expected {}", i, word, type, want);
      // The hierarchical softmax builds its tree from the label counts, with
      // 1e15 as "infinite".
      if (count < 0 || count >= int64_t(1e15))
        bad("corrupt: vocabulary entry {} ('{}') has count {}", i, word, count);
    }
    if (pruneidx_size_ < -1) bad("corrupt: pruning table size {}", pruneidx_size_);
    if (pruneidx_size_ > 0 && pruneidx_size_ * 8 > left()) truncated("pruning table");
    for (int64_t i = 0; i < pruneidx_size_; ++i) {
      int32_t from = read<int32_t>("pruning table");
      int32_t to = read<int32_t>("pruning table");
      if (from < 0 || to < 0) bad("corrupt: pruning table entry {} -> {}", from, to);
      max_pruned_row_ = std::max<int64_t>(max_pruned_row_, to);
    }
  }

  // `min_rows`: rows prediction may index; `exact_rows`: the row count the
  // matrix must have, or -1.
  void check_matrix(const char* name, bool quantized, int64_t min_rows, int64_t exact_rows) {
    std::string what = fmt::format("{} matrix", name);
    const char* w = what.c_str();
    bool qnorm = quantized && read_bool(w);  // norms quantized separately
    int64_t rows = read<int64_t>(w), cols = read<int64_t>(w);
    if (cols != dim_)
      bad("corrupt: the {} has {} columns, the model's dimension is {}", what, cols, dim_);
    if (rows < min_rows || (exact_rows >= 0 && rows != exact_rows))
      bad("corrupt: the {} has {} rows, expected {}{}", what, rows,
          exact_rows >= 0 ? "" : "at least ", exact_rows >= 0 ? exact_rows : min_rows);
    if (!quantized) {
      if (rows > 0 && cols > left() / 4 / rows) truncated(w);
      skip(rows * cols * 4, w);
      return;
    }
    int32_t codesize = read<int32_t>(w);
    if (codesize < 0) bad("corrupt: the {} has code size {}", what, codesize);
    skip(codesize, w);
    int32_t nsubq = check_quantizer(w, int32_t(cols));
    if (int64_t(codesize) != rows * nsubq)
      bad("corrupt: the {} has {} code bytes for {} rows of {} sub-quantizers", what, codesize,
          rows, nsubq);
    if (qnorm) {
      skip(rows, w);
      check_quantizer(w, 1);
    }
  }

  // A product quantizer for vectors of `dim`; returns its sub-quantizer count.
  int32_t check_quantizer(const char* w, int32_t dim) {
    int32_t qdim = read<int32_t>(w), nsubq = read<int32_t>(w);
    int32_t dsub = read<int32_t>(w), lastdsub = read<int32_t>(w);
    if (qdim != dim || dsub <= 0 || nsubq != (dim + dsub - 1) / dsub ||
        lastdsub != dim - (nsubq - 1) * dsub)
      bad("corrupt: the {} has an inconsistent quantizer (dim {}, {} sub-quantizers of {}, last "
          "{})",
          w, qdim, nsubq, dsub, lastdsub);
    skip(int64_t(dim) * kCentroidsPerSubquantizer * 4, w);
    return nsubq;
  }

  std::string path_;
  std::ifstream in_;
  int64_t size_ = 0;
  int32_t dim_ = 0, bucket_ = 0, nwords_ = 0, nlabels_ = 0;
  int64_t pruneidx_size_ = -1, max_pruned_row_ = -1;
};

// An istream over bytes fastText reads without copying them again.
class ViewBuf : public std::streambuf {
 public:
  void reset(char* data, size_t n) { setg(data, data, data + n); }
};

struct Scratch {
  std::string line;
  ViewBuf buf;
  std::istream in{&buf};
  std::vector<int32_t> words, labels;
  fasttext::Predictions preds;
};

}  // namespace

void validate_fasttext_file(const std::string& path) {
  ModelFileChecker(path).check();
}

FastTextModel::FastTextModel(const std::string& path) : path_(path) {
  validate_fasttext_file(path);
  ft_ = std::make_unique<fasttext::FastText>();
  try {
    ft_->loadModel(path);
  } catch (const std::bad_alloc&) {
    fail("fastText model '{}': out of memory while loading it", path);
  } catch (const std::exception& e) {
    fail("fastText model '{}': {}", path, e.what());
  }
  auto dict = ft_->getDictionary();
  for (int32_t i = 0; i < dict->nlabels(); ++i) labels_.push_back(dict->getLabel(i));
}

FastTextModel::~FastTextModel() = default;

int FastTextModel::label_index(std::string_view label) const {
  for (size_t i = 0; i < labels_.size(); ++i)
    if (labels_[i] == label) return int(i);
  return -1;
}

int FastTextModel::dim() const {
  return ft_->getDimension();
}

bool FastTextModel::quantized() const {
  return ft_->isQuant();
}

void FastTextModel::predict_ids(std::string_view text, int k, float threshold,
                                std::vector<std::pair<float, int>>& out) const {
  thread_local Scratch s;
  // One line, as fastText's CLI reads it from a file: '\n' would end the line
  // early, and the final '\n' is read as the end-of-sentence token "</s>".
  s.line.assign(text);
  for (char& c : s.line)
    if (c == '\n') c = ' ';
  s.line.push_back('\n');
  s.buf.reset(s.line.data(), s.line.size());
  s.in.clear();
  ft_->getDictionary()->getLine(s.in, s.words, s.labels);
  s.preds.clear();
  out.clear();
  if (s.words.empty()) return;
  ft_->predict(k < 0 ? -1 : k, s.words, s.preds, threshold);
  for (auto& [logp, id] : s.preds) out.emplace_back(logp, id);
}

std::vector<Prediction> FastTextModel::predict(std::string_view text, int k,
                                               float threshold) const {
  std::vector<Prediction> out;
  if (k == 0) return out;
  thread_local std::vector<std::pair<float, int>> ids;
  predict_ids(text, k, threshold, ids);
  for (auto& [logp, id] : ids) out.push_back({labels_[size_t(id)], std::exp(logp)});
  return out;
}

float FastTextModel::label_prob(std::string_view text, int label_index) const {
  thread_local std::vector<std::pair<float, int>> ids;
  predict_ids(text, -1, 0.0f, ids);
  for (auto& [logp, id] : ids)
    if (id == label_index) return std::exp(logp);
  return 0;
}

}  // namespace nk::curate
