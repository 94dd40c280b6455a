// Real English documents for the dedup and MinHash tests, from GCIDE (the
// dictionary Debian's dict-gcide installs; dictzip is gzip-compatible), and
// word-level edits at a known rate to plant near-duplicates.
#pragma once
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <random>
#include <string>
#include <vector>

namespace nk::curate::test_docs {

// Documents of at least `min_chars`: consecutive entries joined until long
// enough, starting `skip` bytes in (past the dictionary's front matter).
inline std::vector<std::string> gcide_docs(size_t count, size_t min_chars, size_t skip = 65536) {
  gzFile f = gzopen("/usr/share/dictd/gcide.dict.dz", "rb");
  EXPECT_TRUE(f) << "/usr/share/dictd/gcide.dict.dz is missing (apt-get install dict-gcide)";
  std::vector<std::string> docs;
  if (!f) return docs;
  std::string text(std::max(size_t(6) << 20, skip + count * (min_chars + 600)), '\0');
  int n = gzread(f, text.data(), unsigned(text.size()));
  gzclose(f);
  text.resize(size_t(std::max(n, 0)));
  std::string doc;
  for (size_t at = skip; at < text.size() && docs.size() < count;) {
    size_t end = text.find("\n\n", at);
    if (end == std::string::npos) break;
    doc.append(text, at, end + 2 - at);
    at = end + 2;
    if (doc.size() >= min_chars) docs.push_back(std::move(doc)), doc.clear();
  }
  return docs;
}

// Edits a fraction `rate` of the words (substitution, deletion or insertion,
// equally likely), keeping the white space between the others.
inline std::string edit_words(const std::string& text, double rate, std::mt19937_64& rng) {
  static const char* vocab[] = {"apple", "river", "stone",  "quickly", "under", "seven",
                                "blue",  "grain", "harbor", "within",  "light", "carry"};
  std::uniform_real_distribution<double> u(0, 1);
  std::string out;
  for (size_t i = 0; i < text.size();) {
    size_t w = i;
    while (w < text.size() && !std::isspace(uint8_t(text[w]))) ++w;
    size_t s = w;
    while (s < text.size() && std::isspace(uint8_t(text[s]))) ++s;
    std::string word = text.substr(i, w - i), sep = text.substr(w, s - w);
    if (!word.empty() && u(rng) < rate) {
      int kind = int(u(rng) * 3);
      std::string other = vocab[rng() % 12];
      if (kind == 0) word = other;
      if (kind == 1) word.clear(), sep.clear();
      if (kind == 2) out.append(other).push_back(' ');
    }
    out.append(word).append(sep);
    i = s;
  }
  return out;
}

}  // namespace nk::curate::test_docs
