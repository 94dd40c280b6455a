#include "data/dataset/gpt_dataset.h"

#include <filesystem>

#include "core/error.h"
#include "core/log.h"

namespace nk {

namespace fs = std::filesystem;

GPTDataset::GPTDataset(std::shared_ptr<const IndexedDataset> data, const GPTDatasetConfig& cfg)
    : data_(std::move(data)), cfg_(cfg) {
  NK_CHECK(data_ != nullptr, "GPTDataset needs an indexed dataset");
  const std::string& prefix = data_->prefix();
  if (cfg_.seq_len <= 0) fail("'{}': seq_len must be positive, got {}", prefix, cfg_.seq_len);
  if (cfg_.num_samples <= 0)
    fail("'{}': num_samples must be positive, got {}", prefix, cfg_.num_samples);
  std::array<double, 3> fractions = parse_split(cfg_.split);

  const std::vector<int64_t>& doc_idx = data_->doc_idx();
  const std::vector<int32_t>& lengths = data_->lengths();
  int64_t n_docs = data_->num_documents();
  doc_lengths_.resize(size_t(n_docs));
  for (int64_t d = 0; d < n_docs; ++d) {
    int64_t sum = 0;
    for (int64_t s = doc_idx[size_t(d)]; s < doc_idx[size_t(d) + 1]; ++s) sum += lengths[size_t(s)];
    doc_lengths_[size_t(d)] = sum;
  }
  auto bounds = split_boundaries(fractions, n_docs);
  int w = int(cfg_.which);
  doc_begin_ = bounds[size_t(w)];
  doc_end_ = bounds[size_t(w) + 1];
  const char* name = split_name(cfg_.which);
  if (doc_end_ <= doc_begin_)
    fail("'{}': the {} split of '{}' holds none of the {} documents", prefix, name, cfg_.split,
         n_docs);
  for (int64_t d = doc_begin_; d < doc_end_; ++d) tokens_per_epoch_ += doc_lengths_[size_t(d)];
  if (tokens_per_epoch_ < cfg_.seq_len + 1)
    fail(
        "'{}': the {} split ({} documents) holds {} tokens, fewer than one sample of seq_len + 1 "
        "= {}",
        prefix, name, doc_end_ - doc_begin_, tokens_per_epoch_, cfg_.seq_len + 1);
  num_epochs_ = num_epochs_for(tokens_per_epoch_, cfg_.seq_len, cfg_.num_samples);
  separate_final_epoch_ =
      use_separate_final_epoch(num_epochs_, tokens_per_epoch_, cfg_.seq_len, cfg_.num_samples);
  num_samples_built_ = samples_in_epochs(num_epochs_, tokens_per_epoch_, cfg_.seq_len);

  std::string abs_prefix = fs::weakly_canonical(fs::absolute(prefix)).string();
  std::string dir = cfg_.cache_dir.empty() ? (fs::path(abs_prefix).parent_path() / "cache").string()
                                           : cfg_.cache_dir;
  // Every setting that changes an index; the data's size guards against a
  // rewritten dataset under the same prefix.
  std::string description = fmt::format(
      "{{\"class\": \"GPTDataset\", \"format\": 1, \"path_prefix\": \"{}\", \"documents\": {}, "
      "\"sequences\": {}, \"tokens\": {}, \"split\": [{}, {}, {}], \"split_name\": \"{}\", "
      "\"sequence_length\": {}, \"num_samples\": {}, \"random_seed\": {}, "
      "\"add_extra_token\": 1, \"separate_final_epoch_threshold\": 0.8, \"rng\": "
      "\"splitmix64+fisher-yates\"}}",
      abs_prefix, n_docs, data_->num_sequences(), data_->num_tokens(), fractions[0], fractions[1],
      fractions[2], name, cfg_.seq_len, cfg_.num_samples, cfg_.seed);
  cache_ = std::make_unique<IndexCache>(dir, std::string("GPTDataset-") + name, description);

  loaded_from_cache_ = cache_->load("document_index", document_index_) &&
                       cache_->load("sample_index", sample_index_) &&
                       cache_->load("shuffle_index", shuffle_index_) && indices_consistent();
  if (!loaded_from_cache_) {
    build_indices();
    cache_->save("document_index", document_index_);
    cache_->save("sample_index", sample_index_);
    cache_->save("shuffle_index", shuffle_index_);
  }
}

bool GPTDataset::indices_consistent() const {
  int64_t docs = (doc_end_ - doc_begin_) * num_epochs_;
  bool ok = int64_t(document_index_.size()) == docs &&
            int64_t(sample_index_.size()) == 2 * (num_samples_built_ + 1) &&
            int64_t(shuffle_index_.size()) == num_samples_built_;
  for (size_t i = 0; ok && i < document_index_.size(); ++i)
    ok = document_index_[i] >= doc_begin_ && document_index_[i] < doc_end_;
  for (size_t i = 0; ok && i < shuffle_index_.size(); ++i)
    ok = shuffle_index_[i] >= 0 && shuffle_index_[i] < num_samples_built_;
  for (size_t j = 0; ok && j < sample_index_.size(); j += 2)
    ok = sample_index_[j] >= 0 && sample_index_[j] < docs && sample_index_[j + 1] >= 0 &&
         sample_index_[j + 1] < doc_lengths_[size_t(document_index_[size_t(sample_index_[j])])];
  if (!ok) NK_WARN("index cache '{}' does not fit the data; rebuilding it", cache_->path("*"));
  return ok;
}

void GPTDataset::build_indices() {
  // One stream: document index, then shuffle index, as Megatron draws them.
  Rng rng(cfg_.seed);
  document_index_ =
      build_document_index(doc_begin_, doc_end_, num_epochs_, separate_final_epoch_, rng);
  sample_index_ =
      build_sample_index(doc_lengths_, document_index_, cfg_.seq_len, num_samples_built_);
  int64_t first = separate_final_epoch_
                      ? samples_in_epochs(num_epochs_ - 1, tokens_per_epoch_, cfg_.seq_len)
                      : num_samples_built_;
  shuffle_index_ = build_shuffle_index(first, num_samples_built_, rng);
}

void GPTDataset::read_document(int64_t doc, int64_t start, int64_t count, int32_t* out) const {
  const std::vector<int64_t>& doc_idx = data_->doc_idx();
  const std::vector<int32_t>& lengths = data_->lengths();
  for (int64_t s = doc_idx[size_t(doc)]; s < doc_idx[size_t(doc) + 1] && count > 0; ++s) {
    int64_t len = lengths[size_t(s)];
    if (start >= len) {
      start -= len;
      continue;
    }
    int64_t n = std::min(count, len - start);
    data_->read(s, start, n, out);
    out += n;
    count -= n;
    start = 0;
  }
  NK_CHECK(count == 0, "read past document {} of '{}'", doc, data_->prefix());
}

void GPTDataset::unshuffled_sample(int64_t j, int32_t* out) const {
  NK_CHECK(j >= 0 && j < num_samples_built_, "sample {} of {}", j, num_samples_built_);
  int64_t p0 = sample_index_[size_t(2 * j)], o0 = sample_index_[size_t(2 * j + 1)];
  int64_t p1 = sample_index_[size_t(2 * j + 2)], o1 = sample_index_[size_t(2 * j + 3)];
  int64_t written = 0;
  for (int64_t p = p0; p <= p1; ++p) {
    int64_t doc = document_index_[size_t(p)];
    int64_t start = p == p0 ? o0 : 0;
    int64_t stop = p == p1 ? o1 + 1 : doc_lengths_[size_t(doc)];  // exclusive
    NK_CHECK(written + stop - start <= cfg_.seq_len + 1, "sample {} is too long", j);
    read_document(doc, start, stop - start, out + written);
    written += stop - start;
  }
  NK_CHECK(written == cfg_.seq_len + 1, "sample {} has {} tokens", j, written);
}

void GPTDataset::sample(int64_t i, int32_t* out) const {
  NK_CHECK(i >= 0 && i < size(), "sample {} of {}", i, size());
  unshuffled_sample(shuffle_index_[size_t(i)], out);
}

std::string GPTDataset::name() const {
  return fmt::format("indexed dataset '{}' ({} split)", data_->prefix(), split_name(cfg_.which));
}

}  // namespace nk
