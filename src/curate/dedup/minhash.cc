#include "curate/dedup/minhash.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <cstring>

// Shingles are short: inlining XXH3 is most of its speed. Its long-input
// path is never hot here; the scalar one avoids GCC 12 false warnings in the
// inlined AVX-512 code.
#define XXH_INLINE_ALL
#define XXH_VECTOR 0
#include <xxhash.h>

#include "core/error.h"
#include "curate/words.h"

namespace nk::curate {

namespace {

constexpr size_t kLanes = 16;

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint32_t fold(uint64_t h) {
  return uint32_t(h ^ (h >> 32));
}

bool all_ascii(std::string_view s) {
  uint64_t acc = 0;
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    acc |= w;
  }
  for (; i < s.size(); ++i) acc |= uint8_t(s[i]);
  return (acc & 0x8080808080808080ull) == 0;
}

void char_shingles(std::string_view text, int n, std::vector<uint32_t>& out) {
  if (all_ascii(text)) {
    if (text.size() <= size_t(n)) {
      out.push_back(fold(XXH3_64bits(text.data(), text.size())));
      return;
    }
    size_t count = text.size() - size_t(n) + 1;
    size_t at = out.size();
    out.resize(at + count);
    uint32_t* o = out.data() + at;
    for (size_t i = 0; i < count; ++i) o[i] = fold(XXH3_64bits(text.data() + i, size_t(n)));
    return;
  }
  // Byte offsets of code point starts, plus the end.
  thread_local std::vector<uint32_t> starts;
  starts.clear();
  for (size_t i = 0; i < text.size(); ++i)
    if ((uint8_t(text[i]) & 0xC0) != 0x80) starts.push_back(uint32_t(i));
  starts.push_back(uint32_t(text.size()));
  size_t cps = starts.size() - 1;
  if (cps <= size_t(n)) {
    out.push_back(fold(XXH3_64bits(text.data(), text.size())));
    return;
  }
  for (size_t i = 0; i + size_t(n) <= cps; ++i)
    out.push_back(fold(XXH3_64bits(text.data() + starts[i], starts[i + n] - starts[i])));
}

void word_shingles(std::string_view text, int n, std::vector<uint32_t>& out) {
  thread_local std::vector<std::string_view> words;
  thread_local std::vector<uint64_t> hashes;
  thread_local std::string lower;
  words.clear();
  hashes.clear();
  split_words(text, words);
  for (std::string_view w : words) {
    lower.clear();
    append_lowercase(w, lower);
    hashes.push_back(XXH3_64bits(lower.data(), lower.size()));
  }
  if (hashes.size() <= size_t(n)) {
    out.push_back(fold(XXH3_64bits(hashes.data(), hashes.size() * 8)));
    return;
  }
  for (size_t i = 0; i + size_t(n) <= hashes.size(); ++i)
    out.push_back(fold(XXH3_64bits(hashes.data() + i, size_t(n) * 8)));
}

}  // namespace

bool minhash_preset(const std::string& name, MinHashParams& out) {
  if (name == "nemo") {
    out.kind = ShingleKind::kChars;
    out.ngram = 24;
    out.num_bands = 20;
    out.rows_per_band = 13;
    return true;
  }
  if (name == "fineweb") {
    out.kind = ShingleKind::kWords;
    out.ngram = 5;
    out.num_bands = 14;
    out.rows_per_band = 8;
    return true;
  }
  return false;
}

void append_lowercase(std::string_view text, std::string& out) {
  for (size_t i = 0; i < text.size();) {
    uint8_t c = uint8_t(text[i]);
    if (c < 0x80) {
      out.push_back(c >= 'A' && c <= 'Z' ? char(c + 32) : char(c));
      ++i;
      continue;
    }
    append_utf8(char32_t(u_tolower(UChar32(next_code_point(text, i)))), out);
  }
}

MinHasher::MinHasher(const MinHashParams& p) : p_(p) {
  NK_CHECK(p.num_bands > 0 && p.rows_per_band > 0 && p.ngram > 0, "bad MinHash parameters");
  size_t k = size_t(p.num_hashes());
  padded_ = (k + kLanes - 1) / kLanes * kLanes;
  a_.assign(padded_, 1);
  b_.assign(padded_, 0);
  uint64_t s = p.seed;
  for (size_t i = 0; i < k; ++i) {
    uint64_t r = splitmix64(s);
    a_[i] = uint32_t(r) | 1u;
    b_[i] = uint32_t(r >> 32);
  }
}

void MinHasher::shingles(std::string_view text, std::vector<uint32_t>& out) const {
  if (p_.kind == ShingleKind::kChars)
    char_shingles(text, p_.ngram, out);
  else
    word_shingles(text, p_.ngram, out);
}

void MinHasher::signature_scalar(const uint32_t* x, size_t n, uint32_t* sig) const {
  for (int i = 0; i < num_hashes(); ++i) {
    uint32_t m = UINT32_MAX, a = a_[size_t(i)], b = b_[size_t(i)];
    for (size_t j = 0; j < n; ++j) m = std::min(m, a * x[j] + b);
    sig[i] = m;
  }
}

void MinHasher::signature(const uint32_t* x, size_t n, uint32_t* sig) const {
  // Blocks of 16 hash functions (one AVX-512 register with -march=native; two
  // AVX2 ones, or scalar code, elsewhere), each kept in registers over a run
  // of shingles short enough to stay in L1 across the blocks. GCC vector
  // types rather than intrinsics: the same mullo/add/min instructions, without
  // GCC 12's false "uninitialized" errors in the AVX-512 intrinsic headers.
  typedef uint32_t V __attribute__((vector_size(64)));
  constexpr size_t kRun = 4096;
  // Loads through an out-parameter: returning a 64-byte vector by value
  // changes the ABI on CPUs without AVX-512 (GCC's -Wpsabi).
  auto load = [](V& v, const uint32_t* p) { std::memcpy(&v, p, sizeof(V)); };
  thread_local std::vector<uint32_t> acc;
  acc.assign(padded_, UINT32_MAX);
  for (size_t r0 = 0; r0 < n; r0 += kRun) {
    size_t r1 = std::min(n, r0 + kRun);
    for (size_t blk = 0; blk < padded_; blk += kLanes) {
      V a, b, m0;
      load(a, a_.data() + blk);
      load(b, b_.data() + blk);
      load(m0, acc.data() + blk);
      V m1 = m0;
      size_t j = r0;
      for (; j + 2 <= r1; j += 2) {
        V h0 = a * x[j] + b, h1 = a * x[j + 1] + b;
        m0 = h0 < m0 ? h0 : m0;
        m1 = h1 < m1 ? h1 : m1;
      }
      if (j < r1) {
        V h0 = a * x[j] + b;
        m0 = h0 < m0 ? h0 : m0;
      }
      m0 = m1 < m0 ? m1 : m0;
      std::memcpy(acc.data() + blk, &m0, sizeof(V));
    }
  }
  std::memcpy(sig, acc.data(), size_t(num_hashes()) * sizeof(uint32_t));
}

void MinHasher::signature(std::string_view text, uint32_t* sig) const {
  thread_local std::vector<uint32_t> sh;
  sh.clear();
  shingles(text, sh);
  signature(sh.data(), sh.size(), sig);
}

uint64_t MinHasher::band_hash(const uint32_t* sig, int band) const {
  return XXH3_64bits_withSeed(sig + size_t(band) * size_t(p_.rows_per_band),
                              size_t(p_.rows_per_band) * sizeof(uint32_t), uint64_t(band));
}

double signature_similarity(const uint32_t* a, const uint32_t* b, int k) {
  int eq = 0;
  for (int i = 0; i < k; ++i) eq += a[i] == b[i];
  return k > 0 ? double(eq) / k : 0.0;
}

void sort_unique(std::vector<uint32_t>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

double jaccard(const uint32_t* a, size_t na, const uint32_t* b, size_t nb) {
  if (na == 0 && nb == 0) return 1.0;
  size_t i = 0, j = 0, common = 0;
  while (i < na && j < nb) {
    if (a[i] < b[j])
      ++i;
    else if (b[j] < a[i])
      ++j;
    else
      ++common, ++i, ++j;
  }
  return double(common) / double(na + nb - common);
}

}  // namespace nk::curate
