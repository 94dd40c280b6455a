#include "curate/classify/classifier_train.h"

#include <fasttext/fasttext.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "curate/classify/fasttext_model.h"
#include "data/jsonl_reader.h"

namespace nk::curate {

namespace {

namespace fs = std::filesystem;

// Removes the file at `path` when it goes out of scope, unless released.
class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)) {}
  ~TempFile() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }
  void release() { path_.clear(); }

 private:
  std::string path_;
};

struct Example {
  std::string label;  // with "__label__"
  std::string text;   // one line, as fastText reads it
};

// One line of fastText input: no newlines, and no "__label__" that fastText
// would take for a label (NeMo Curator's quality filter does the same).
std::string one_line(std::string_view text) {
  std::string s;
  s.reserve(text.size());
  for (size_t at = 0;;) {
    size_t found = text.find(kLabelPrefix, at);
    s.append(text.substr(at, found - at));
    if (found == std::string_view::npos) break;
    s.push_back(' ');
    at = found + kLabelPrefix.size();
  }
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

std::string label_of(const nlohmann::json& v, const std::string& where, const std::string& key) {
  std::string s;
  if (v.is_string())
    s = v.get<std::string>();
  else if (v.is_number_integer() || v.is_number_unsigned() || v.is_number_float())
    s = v.dump();
  else
    fail("{}: field '{}' must be a string or a number, got {}", where, key, v.type_name());
  if (s.empty()) fail("{}: field '{}' is an empty label", where, key);
  for (unsigned char c : s)
    if (std::isspace(c))
      fail("{}: label '{}' (field '{}') contains whitespace, which fastText cannot store", where, s,
           key);
  return s.starts_with(kLabelPrefix) ? s : std::string(kLabelPrefix) + s;
}

std::string short_label(const std::string& l) {
  return l.starts_with(kLabelPrefix) ? l.substr(kLabelPrefix.size()) : l;
}

void check_options(const ClassifierTrainOptions& o) {
  if (o.input.empty()) fail("train-classifier: no input file (--input FILE.jsonl)");
  if (o.output.empty()) fail("train-classifier: no output file (--output MODEL.bin)");
  if (fs::is_directory(o.output)) fail("output '{}': is a folder; give a file name", o.output);
  fs::path parent = fs::path(o.output).parent_path();
  if (!parent.empty() && !fs::is_directory(parent))
    fail("output '{}': folder '{}' does not exist", o.output, parent.string());
  if (o.text_key.empty() || o.label_key.empty()) fail("train-classifier: empty field name");
  if (o.epoch < 1) fail("--epoch: must be at least 1, got {}", o.epoch);
  if (!(o.lr > 0 && o.lr < 100)) fail("--lr: must be positive, got {}", o.lr);
  if (o.word_ngrams < 1 || o.word_ngrams > 10)
    fail("--word-ngrams: must be in [1, 10], got {}", o.word_ngrams);
  if (o.dim < 1 || o.dim > 10000) fail("--dim: must be in [1, 10000], got {}", o.dim);
  if (o.min_count < 1) fail("--min-count: must be at least 1, got {}", o.min_count);
  if (o.threads < 1 || o.threads > 1024) fail("--threads: must be in [1, 1024], got {}", o.threads);
  if (o.word_ngrams > 1 && (o.bucket < 1 || o.bucket > (int64_t(1) << 30)))
    fail("--bucket: must be in [1, 2^30] with --word-ngrams {}, got {}", o.word_ngrams, o.bucket);
  if (!(o.valid_fraction >= 0 && o.valid_fraction < 1))
    fail("--valid-fraction: must be in [0, 1), got {}", o.valid_fraction);
}

// Flushes `path` to disk and renames it to `to`.
void commit_file(const std::string& path, const std::string& to) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    int err = errno;
    if (fd >= 0) ::close(fd);
    fail("output '{}': cannot sync '{}': {}", to, path, std::strerror(err));
  }
  ::close(fd);
  if (::rename(path.c_str(), to.c_str()) != 0)
    fail("output '{}': cannot rename '{}' to it: {}", to, path, std::strerror(errno));
}

}  // namespace

ClassifierTrainReport train_quality_classifier(const ClassifierTrainOptions& o) {
  check_options(o);
  ClassifierTrainReport r;
  TempFile train_file(temporary_path(o.output + ".train"));
  TempFile model_file(temporary_path(o.output));

  // The training part goes to a fastText input file; the held-out part stays
  // in memory for evaluation.
  std::vector<Example> valid;
  std::map<std::string, int64_t> train_counts, all_counts;
  int64_t first_line = 0, last_line = 0;
  {
    std::ofstream out(train_file.path(), std::ios::binary);
    if (!out)
      fail("output '{}': cannot create temporary file '{}': {}", o.output, train_file.path(),
           std::strerror(errno));
    JsonlReader reader(o.input);
    std::string_view line;
    int64_t line_no = 0;
    while (reader.read_line(line, line_no)) {
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      std::string where = fmt::format("{}:{}", o.input, line_no);
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::parse_error& e) {
        fail("{}: invalid JSON: {}", where, e.what());
      }
      if (!j.is_object()) fail("{}: expected a JSON object, got {}", where, j.type_name());
      auto t = j.find(o.text_key);
      if (t == j.end())
        fail("{}: missing field '{}' (the text; see --text-key)", where, o.text_key);
      if (!t->is_string())
        fail("{}: field '{}' must be a string, got {}", where, o.text_key, t->type_name());
      auto l = j.find(o.label_key);
      if (l == j.end())
        fail("{}: missing field '{}' (the label; see --label-key)", where, o.label_key);
      std::string label = label_of(*l, where, o.label_key);
      std::string text = one_line(t->get_ref<const std::string&>());
      if (!first_line) first_line = line_no;
      last_line = line_no;
      ++all_counts[label];
      uint64_t h = XXH3_64bits_withSeed(text.data(), text.size(), o.seed);
      if (double(h >> 11) * 0x1p-53 < o.valid_fraction) {
        valid.push_back({std::move(label), std::move(text)});
      } else {
        out << label << ' ' << text << '\n';
        ++train_counts[label];
        ++r.train_docs;
      }
    }
    out.close();
    if (!out)
      fail("output '{}': cannot write temporary file '{}' (disk full?)", o.output,
           train_file.path());
  }
  r.valid_docs = int64_t(valid.size());
  if (all_counts.empty()) fail("{}: no records to train on", o.input);
  if (all_counts.size() < 2)
    fail("{}:{}-{}: every record has label '{}'; a classifier needs at least two labels", o.input,
         first_line, last_line, short_label(all_counts.begin()->first));
  if (train_counts.size() < 2)
    fail(
        "{}: after holding out {} of {} records only label '{}' is left to train on; add data "
        "or lower --valid-fraction",
        o.input, r.valid_docs, r.valid_docs + r.train_docs,
        train_counts.empty() ? "" : short_label(train_counts.begin()->first));
  for (auto& [label, n] : train_counts) r.train_label_counts.emplace_back(short_label(label), n);

  fasttext::Args args;
  args.input = train_file.path();
  args.model = fasttext::model_name::sup;
  args.loss = fasttext::loss_name::softmax;
  args.lr = o.lr;
  args.epoch = o.epoch;
  args.wordNgrams = o.word_ngrams;
  args.dim = o.dim;
  args.minCount = o.min_count;
  args.minn = 0;  // no character n-grams, as `fasttext supervised`
  args.maxn = 0;
  args.bucket = o.word_ngrams > 1 ? int(o.bucket) : 0;
  args.thread = o.threads;
  args.seed = int(o.seed & 0x7fffffff);
  args.verbose = 0;
  auto t0 = std::chrono::steady_clock::now();
  {
    fasttext::FastText ft;
    try {
      ft.train(args);
      ft.saveModel(model_file.path());
    } catch (const std::bad_alloc&) {
      fail("training on '{}': out of memory (try a smaller --bucket or --dim)", o.input);
    } catch (const std::exception& e) {
      fail("training on '{}': {}", o.input, e.what());
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Reopen what was written: this checks the saved file in full, and the
  // held-out scores come from exactly what the classifier stage will load.
  FastTextModel model(model_file.path());
  if (!valid.empty()) {
    std::map<std::string, LabelMetrics> m;
    for (auto& [label, n] : all_counts) m[label].label = short_label(label);
    int64_t correct = 0;
    for (const Example& ex : valid) {
      std::vector<Prediction> p = model.predict(ex.text, 1, 0);
      std::string guess = p.empty() ? std::string() : p[0].label;
      ++m[ex.label].support;
      if (!guess.empty()) {
        if (!m.count(guess)) m[guess].label = short_label(guess);
        ++m[guess].predicted;
      }
      if (guess == ex.label) {
        ++m[ex.label].correct;
        ++correct;
      }
    }
    for (auto& [label, lm] : m) {
      lm.precision = lm.predicted ? double(lm.correct) / double(lm.predicted) : 0;
      lm.recall = lm.support ? double(lm.correct) / double(lm.support) : 0;
      double s = lm.precision + lm.recall;
      lm.f1 = s > 0 ? 2 * lm.precision * lm.recall / s : 0;
      r.metrics.push_back(lm);
    }
    r.accuracy = double(correct) / double(valid.size());
  }
  commit_file(model_file.path(), o.output);
  model_file.release();
  return r;
}

std::string format_train_report(const ClassifierTrainOptions& o, const ClassifierTrainReport& r) {
  std::string out = fmt::format("trained on {} documents from {} in {:.1f} s (", r.train_docs,
                                o.input, r.seconds);
  for (size_t i = 0; i < r.train_label_counts.size(); ++i)
    out += fmt::format("{}{} {}", i ? ", " : "", r.train_label_counts[i].first,
                       r.train_label_counts[i].second);
  out += ")\n";
  if (r.valid_docs == 0) {
    out += "no held-out documents (--valid-fraction 0): no evaluation\n";
  } else {
    out += fmt::format("held out {} documents ({:.1f}%):\n", r.valid_docs,
                       100.0 * double(r.valid_docs) / double(r.valid_docs + r.train_docs));
    out += fmt::format("  {:<16} {:>8} {:>10} {:>8} {:>8}\n", "label", "support", "precision",
                       "recall", "f1");
    for (const LabelMetrics& m : r.metrics)
      out += fmt::format("  {:<16} {:>8} {:>10.4f} {:>8.4f} {:>8.4f}\n", m.label, m.support,
                         m.precision, m.recall, m.f1);
    out += fmt::format("  accuracy {:.4f}\n", r.accuracy);
  }
  out += fmt::format("model written to {}\n", o.output);
  return out;
}

}  // namespace nk::curate
