// The multilingual corpus that the BPE parity tests and the tokenizer
// benchmark share: English (GCIDE), German and Russian (fortunes), Chinese
// (fortunes-zh), C headers, and synthetic documents that stress the
// pre-tokenizer (whitespace kinds, digit runs, odd-case contractions, emoji
// ZWJ sequences, combining marks, invalid UTF-8). Deterministic.
#pragma once
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace nk::testing {

struct CorpusDoc {
  std::string name;  // source and index, for messages
  std::string text;  // bytes; valid UTF-8 except in the "invalid" documents
};

inline std::string read_prefix(const std::string& path, size_t max_bytes) {
  std::string out;
  if (path.ends_with(".dz") || path.ends_with(".gz")) {
    gzFile f = gzopen(path.c_str(), "rb");
    if (!f) return out;
    out.resize(max_bytes);
    int n = gzread(f, out.data(), unsigned(max_bytes));
    gzclose(f);
    out.resize(n > 0 ? size_t(n) : 0);
    return out;
  }
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  out = ss.str();
  if (out.size() > max_bytes) out.resize(max_bytes);
  return out;
}

// Cuts `text` into documents of about `size` bytes at line ends.
inline void add_docs(std::vector<CorpusDoc>& docs, const std::string& source, std::string text,
                     size_t size) {
  // Drop a character cut in half by read_prefix.
  while (!text.empty() && (static_cast<unsigned char>(text.back()) & 0x80)) text.pop_back();
  size_t pos = 0, i = 0;
  while (pos < text.size()) {
    size_t end = std::min(text.size(), pos + size);
    size_t nl = text.find('\n', end);
    end = nl == std::string::npos ? text.size() : nl + 1;
    docs.push_back({source + "#" + std::to_string(i++), text.substr(pos, end - pos)});
    pos = end;
  }
}

inline std::string read_all_under(const std::string& dir, size_t max_bytes, bool recurse) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  if (recurse) {
    for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
         it.increment(ec))
      if (it->is_regular_file() && it->path().extension() == ".h")
        files.push_back(it->path().string());
  } else {
    for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::end(it); it.increment(ec))
      if (it->is_regular_file() && !it->path().has_extension())
        files.push_back(it->path().string());
  }
  std::sort(files.begin(), files.end());
  std::string out;
  for (const auto& f : files) {
    if (out.size() >= max_bytes) break;
    out += read_prefix(f, max_bytes - out.size());
  }
  return out;
}

// Hand-picked pieces the fuzz documents are made of.
inline const std::vector<std::string>& fuzz_atoms() {
  static const std::vector<std::string> atoms = {
      "hello",
      "World",
      "HELLO",
      "x",
      "I",
      "don't",
      "DON'T",
      "it's",
      "IT'S",
      "we'll",
      "WE'LL",
      "they're",
      "THEY'RE",
      "I'm",
      "I'M",
      "you've",
      "YOU'VE",
      "he'd",
      "HE'D",
      "'s",
      "'S",
      "'t",
      "'T",
      "'re",
      "'Re",
      "'ll",
      "'LL",
      "'lL",
      "'d",
      "'D",
      "'m",
      "'M",
      "'ve",
      "'VE",
      "'\xC5\xBF",      // 'ſ (long s folds to s)
      "\xE2\x80\x99s",  // ’s
      "0",
      "7",
      "42",
      "123",
      "1234",
      "12345",
      "3.14159",
      "1,000,000",
      "2024-01-31",
      " ",
      "  ",
      "   ",
      "\t",
      "\t\t",
      "\n",
      "\n\n",
      "\r\n",
      "\r",
      " \n",
      "\n ",
      "\v",
      "\f",
      "\xC2\xA0",      // U+00A0 no-break space
      "\xE3\x80\x80",  // U+3000 ideographic space
      "\xE2\x80\xA8",
      "\xE2\x80\xA9",  // U+2028, U+2029
      "\xC2\x85",      // U+0085 next line
      "\xE2\x80\x89",
      "\xE2\x80\xAF",
      "\xE1\x9A\x80",  // thin, narrow nbsp, ogham space
      "\xE1\xA0\x8E",  // U+180E (not White_Space)
      "\xEF\xBB\xBF",  // U+FEFF BOM (not White_Space)
      "\xE2\x80\x8B",  // U+200B zero width space
      ".",
      ",",
      "!",
      "?",
      "...",
      "--",
      "/",
      "//",
      "/\n",
      "\\",
      "(",
      ")",
      "{",
      "}",
      "[",
      "]",
      "<|endoftext|>",
      "<|fim_prefix|>",
      "#",
      "@",
      "$",
      "%",
      "&&",
      "->",
      "::",
      ";",
      "\"",
      "'",
      "''",
      "```",
      "http://example.com/a/b?c=d",
      "foo_bar",
      "camelCase",
      "XMLHttpRequest",
      "\xF0\x9F\x98\x80",                                                          // 😀
      "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD",                                          // 👍🏽
      "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7",  // 👨‍👩‍👧
      "\xF0\x9F\x8F\xB3\xEF\xB8\x8F\xE2\x80\x8D\xF0\x9F\x8C\x88",                  // 🏳️‍🌈
      "\xE2\x9D\xA4\xEF\xB8\x8F",                                                  // ❤️
      "e\xCC\x81",
      "A\xCC\x8A",  // combining acute, ring
      "\xC7\x85",
      "\xC7\x88",  // Dž, Lj (titlecase)
      "\xCA\xB0",
      "\xE1\xB5\x83",  // ʰ, ᵃ (modifier letters)
      "\xE2\x85\xAB",
      "\xC2\xB2",
      "\xC2\xBD",                                  // Ⅻ, ², ½
      "\xEF\xBC\x91\xEF\xBC\x92\xEF\xBC\x93",      // １２３
      "\xD9\xA1\xD9\xA2",                          // Arabic-Indic digits
      "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7",  // مرحبا
      "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87",  // नमस्ते
      "\xE0\xB8\xAA\xE0\xB8\xA7\xE0\xB8\xB1\xE0\xB8\xAA\xE0\xB8\x94\xE0\xB8\xB5",  // สวัสดี
      "\xEC\x95\x88\xEB\x85\x95\xED\x95\x98\xEC\x84\xB8\xEC\x9A\x94",      // 안녕하세요
      "\xE3\x81\x93\xE3\x82\x93\xE3\x81\xAB\xE3\x81\xA1\xE3\x81\xAF",      // こんにちは
      "\xE4\xB8\x96\xE7\x95\x8C",                                          // 世界
      "\xCE\x9A\xCE\xB1\xCE\xBB\xCE\xB7\xCE\xBC\xCE\xAD\xCF\x81\xCE\xB1",  // Καλημέρα
      "\xD7\xA9\xD7\x9C\xD7\x95\xD7\x9D",                                  // שלום
      "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82",                  // Привет
      "Stra\xC3\x9F"
      "e",
      "\xC3\x9C"
      "BER",                               // Straße, ÜBER
      "\xF0\x9D\x90\x80\xF0\x9D\x90\x9A",  // 𝐀𝐚 (math bold)
      "\xF0\xA0\x80\x80",                  // 𠀀 (CJK ext B)
      "\xEF\xBF\xBD",                      // U+FFFD itself
  };
  return atoms;
}

inline const std::vector<std::string>& invalid_atoms() {
  static const std::vector<std::string> atoms = {
      "\xFF",
      "\xFE",
      "\x80",
      "\xBF",
      "\xC3",
      "\xC0\xAF",
      "\xC1\xBF",
      "\xE2\x82",
      "\xE2\x82"
      "A",
      "\xE0\x80\xAF",
      "\xED\xA0\x80",
      "\xED\xBF\xBF",
      "\xF0\x9F\x98",
      "\xF0\x9F",
      "\xF4\x90\x80\x80",
      "\xF5\x80\x80\x80",
      "\xF8\x88\x80\x80\x80",
      "\xC3(",
      "\xE2(\xA1",
  };
  return atoms;
}

// Random documents from the atoms (and, with `invalid`, broken UTF-8).
inline std::string fuzz_doc(std::mt19937_64& rng, size_t items, bool invalid) {
  const auto& atoms = fuzz_atoms();
  const auto& bad = invalid_atoms();
  std::string s;
  for (size_t i = 0; i < items; ++i) {
    uint64_t r = rng();
    if (invalid && r % 7 == 0)
      s += bad[(r >> 8) % bad.size()];
    else
      s += atoms[(r >> 8) % atoms.size()];
  }
  return s;
}

// ~`bytes_per_source` bytes from each real source, plus synthetic documents.
inline std::vector<CorpusDoc> bpe_corpus(size_t bytes_per_source = 256 << 10) {
  std::vector<CorpusDoc> docs;
  const size_t doc_size = 16 << 10;
  // Skip GCIDE's front matter; the entries are English definitions and quotes.
  std::string gcide = read_prefix("/usr/share/dictd/gcide.dict.dz", (1 << 20) + bytes_per_source);
  add_docs(docs, "gcide", gcide.size() > (1 << 20) ? gcide.substr(1 << 20) : gcide, doc_size);
  add_docs(docs, "fortunes-de",
           read_all_under("/usr/share/games/fortunes/de", bytes_per_source, false), doc_size);
  add_docs(docs, "fortunes-ru",
           read_all_under("/usr/share/games/fortunes/ru", bytes_per_source, false), doc_size);
  add_docs(docs, "fortunes-zh", read_prefix("/usr/share/games/fortunes/chinese", bytes_per_source),
           doc_size);
  add_docs(docs, "usr-include", read_all_under("/usr/include", bytes_per_source, true), doc_size);

  std::mt19937_64 rng(20240531);
  size_t n_fuzz = std::max<size_t>(8, bytes_per_source / (8 << 10));
  for (size_t i = 0; i < n_fuzz; ++i)
    docs.push_back({"fuzz#" + std::to_string(i), fuzz_doc(rng, 800, false)});
  for (size_t i = 0; i < n_fuzz / 2; ++i)
    docs.push_back({"fuzz-invalid#" + std::to_string(i), fuzz_doc(rng, 800, true)});
  // Long runs: pieces far longer than the short-piece merge path.
  docs.push_back({"long-spaces", std::string(3000, ' ') + "x" + std::string(700, '\n') + "y"});
  docs.push_back({"long-digits", std::string(" ") + std::string(2000, '7') + " 0123456789"});
  docs.push_back({"long-letters", std::string(1500, 'a') + " " + std::string(900, 'Z')});
  std::string emoji;
  for (int i = 0; i < 300; ++i) emoji += "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x92\xBB";
  docs.push_back({"long-emoji", emoji});
  std::string mixed_ws;
  for (int i = 0; i < 200; ++i) mixed_ws += " \t\xC2\xA0\xE3\x80\x80\r\n\xE2\x80\xA8\xC2\x85";
  docs.push_back({"long-unicode-spaces", mixed_ws + "end"});
  docs.push_back({"empty", ""});
  return docs;
}

}  // namespace nk::testing
