#include "data/dataset/gpt_indices.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace nk {

const char* split_name(DataSplit s) {
  static const char* names[] = {"train", "valid", "test"};
  return names[int(s)];
}

std::array<double, 3> parse_split(const std::string& text) {
  std::vector<double> parts;
  size_t at = 0;
  while (true) {
    size_t comma = text.find(',', at);
    std::string part = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    size_t b = part.find_first_not_of(" \t"), e = part.find_last_not_of(" \t");
    part = b == std::string::npos ? "" : part.substr(b, e - b + 1);
    char* end = nullptr;
    double v = part.empty() ? NAN : std::strtod(part.c_str(), &end);
    if (part.empty() || *end != '\0' || !std::isfinite(v))
      fail("split '{}': '{}' is not a number (expected e.g. 969,30,1)", text, part);
    if (v < 0) fail("split '{}': negative part {}", text, v);
    parts.push_back(v);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (parts.size() > 3)
    fail("split '{}': {} parts, expected at most 3 (train,valid,test)", text, parts.size());
  double sum = 0;
  for (double v : parts) sum += v;
  if (!(sum > 0)) fail("split '{}': the parts sum to zero", text);
  std::array<double, 3> f = {0, 0, 0};
  for (size_t i = 0; i < parts.size(); ++i) f[i] = parts[i] / sum;
  return f;
}

std::array<int64_t, 4> split_boundaries(const std::array<double, 3>& fractions, int64_t n) {
  std::array<int64_t, 4> b = {0, 0, 0, 0};
  for (int s = 0; s < 3; ++s) b[s + 1] = b[s] + int64_t(std::nearbyint(fractions[s] * double(n)));
  int64_t diff = b[3] - n;
  for (int s = 1; s < 4; ++s) b[s] = std::clamp<int64_t>(b[s] - diff, b[s - 1], n);
  b[3] = n;
  return b;
}

uint64_t uniform_below(Rng& rng, uint64_t n) {
  // Values below 2^64 mod n would make small results likelier; skip them.
  uint64_t threshold = (0 - n) % n;
  while (true) {
    uint64_t x = rng.next_u64();
    if (x >= threshold) return x % n;
  }
}

void shuffle_in_place(std::vector<int64_t>& a, Rng& rng) {
  for (size_t i = a.size(); i > 1; --i) std::swap(a[i - 1], a[uniform_below(rng, i)]);
}

int64_t samples_in_epochs(int64_t num_epochs, int64_t tokens_per_epoch, int64_t seq_len) {
  return (num_epochs * tokens_per_epoch - 1) / seq_len;
}

int64_t num_epochs_for(int64_t tokens_per_epoch, int64_t seq_len, int64_t num_samples) {
  NK_CHECK(tokens_per_epoch > 0 && seq_len > 0, "empty epoch or sequence");
  // Smallest E with E * tpe - 1 >= num_samples * seq_len.
  int64_t need = num_samples * seq_len + 1;
  return std::max<int64_t>(1, (need + tokens_per_epoch - 1) / tokens_per_epoch);
}

bool use_separate_final_epoch(int64_t num_epochs, int64_t tokens_per_epoch, int64_t seq_len,
                              int64_t num_samples) {
  if (num_epochs <= 1) return false;
  int64_t before_final = samples_in_epochs(num_epochs - 1, tokens_per_epoch, seq_len);
  int64_t from_final = num_samples - before_final;
  int64_t per_epoch = (tokens_per_epoch - 1) / seq_len;
  NK_CHECK(from_final >= 0 && from_final <= per_epoch + 1, "epoch arithmetic");
  return from_final < int64_t(0.8 * double(per_epoch));
}

std::vector<int64_t> build_document_index(int64_t begin, int64_t end, int64_t num_epochs,
                                          bool separate_final_epoch, Rng& rng) {
  if (separate_final_epoch && num_epochs > 1) {
    std::vector<int64_t> first = build_document_index(begin, end, num_epochs - 1, false, rng);
    std::vector<int64_t> last = build_document_index(begin, end, 1, false, rng);
    first.insert(first.end(), last.begin(), last.end());
    return first;
  }
  std::vector<int64_t> idx;
  idx.reserve(size_t((end - begin) * num_epochs));
  for (int64_t e = 0; e < num_epochs; ++e)
    for (int64_t d = begin; d < end; ++d) idx.push_back(d);
  shuffle_in_place(idx, rng);
  return idx;
}

std::vector<int64_t> build_sample_index(const std::vector<int64_t>& doc_lengths,
                                        const std::vector<int64_t>& document_index, int64_t seq_len,
                                        int64_t num_samples) {
  std::vector<int64_t> idx(size_t(2 * (num_samples + 1)));
  int64_t pos = 0, offset = 0;  // where the next sample starts
  idx[0] = idx[1] = 0;
  for (int64_t j = 1; j <= num_samples; ++j) {
    // Walk seq_len + 1 tokens forward; the last one is also the next sample's first.
    int64_t remaining = seq_len + 1;
    while (remaining > 0) {
      int64_t left = doc_lengths[size_t(document_index[size_t(pos)])] - offset;
      if (left >= remaining) {
        offset += remaining - 1;
        remaining = 0;
      } else {
        remaining -= left;
        ++pos;
        offset = 0;
        NK_CHECK(pos < int64_t(document_index.size()), "sample {} runs past the data", j);
      }
    }
    idx[size_t(2 * j)] = pos;
    idx[size_t(2 * j + 1)] = offset;
  }
  return idx;
}

std::vector<int64_t> build_shuffle_index(int64_t num_first, int64_t total, Rng& rng) {
  std::vector<int64_t> first(static_cast<size_t>(num_first));
  std::vector<int64_t> last(static_cast<size_t>(total - num_first));
  for (int64_t i = 0; i < num_first; ++i) first[size_t(i)] = i;
  for (int64_t i = num_first; i < total; ++i) last[size_t(i - num_first)] = i;
  shuffle_in_place(first, rng);
  shuffle_in_place(last, rng);
  first.insert(first.end(), last.begin(), last.end());
  return first;
}

}  // namespace nk
