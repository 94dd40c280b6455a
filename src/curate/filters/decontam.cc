#include "curate/filters/decontam.h"

#include <fmt/format.h>
#include <unicode/uchar.h>
#include <unicode/utf8.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "curate/filters/filters.h"
#include "curate/stages.h"
#include "curate/words.h"

namespace nk::curate {

namespace {

// Hash of a word after simple Unicode case folding ("The" = "the", "ÉTÉ" = "été").
uint64_t folded_hash(std::string_view w, std::string& buf) {
  buf.clear();
  for (int32_t i = 0; i < int32_t(w.size());) {
    unsigned char b = static_cast<unsigned char>(w[size_t(i)]);
    if (b < 0x80) {
      buf.push_back(b >= 'A' && b <= 'Z' ? char(b | 0x20) : char(b));
      ++i;
      continue;
    }
    UChar32 c;
    U8_NEXT(w.data(), i, int32_t(w.size()), c);
    if (c < 0) continue;
    c = u_foldCase(c, U_FOLD_CASE_DEFAULT);
    char enc[4];
    int32_t n = 0;
    U8_APPEND_UNSAFE(enc, n, c);
    buf.append(enc, size_t(n));
  }
  return XXH3_64bits(buf.data(), buf.size());
}

void folded_hashes(const std::vector<std::string_view>& words, std::vector<uint64_t>& out) {
  thread_local std::string buf;
  out.resize(words.size());
  for (size_t i = 0; i < words.size(); ++i) out[i] = folded_hash(words[i], buf);
}

// N-grams of different lengths never share a key.
inline uint64_t keyed(uint64_t ngram_hash, size_t len) {
  uint64_t k = ngram_hash ^ (uint64_t(len) * 0xD6E8FEB86659FD93ull);
  return k == 0 ? 1 : k;
}

// Open addressing from n-gram key to the sample it came from (the first one).
class NgramTable {
 public:
  void build(const std::vector<std::pair<uint64_t, uint32_t>>& entries) {
    size_t cap = 16;
    while (cap < 2 * entries.size()) cap <<= 1;
    keys_.assign(cap, 0);
    vals_.assign(cap, 0);
    mask_ = cap - 1;
    for (const auto& [k, v] : entries) {
      size_t i = size_t(k) & mask_;
      while (keys_[i] != 0 && keys_[i] != k) i = (i + 1) & mask_;
      if (keys_[i] == 0) keys_[i] = k, vals_[i] = v;
    }
  }
  // The sample of key k, or -1.
  int64_t find(uint64_t k) const {
    size_t i = size_t(k) & mask_;
    while (keys_[i] != 0) {
      if (keys_[i] == k) return vals_[i];
      i = (i + 1) & mask_;
    }
    return -1;
  }

 private:
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> vals_;
  size_t mask_ = 0;
};

struct Sample {
  uint32_t file = 0, line = 0;
};

struct Hit {
  size_t word = 0, len = 0;  // the n-gram is words [word, word + len)
  uint32_t sample = 0;
};

inline bool is_sentence_end(char c) {
  return c == '.' || c == '!' || c == '?';
}

std::string_view trim_space(std::string_view s) {
  auto sp = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && sp(s.front())) s.remove_prefix(1);
  while (!s.empty() && sp(s.back())) s.remove_suffix(1);
  return s;
}

class DecontamStage final : public DocStage {
 public:
  explicit DecontamStage(const DecontamOptions& opt) : opt_(opt) {
    if (opt_.benchmarks.empty()) fail("decontaminate: no benchmark files given");
    std::vector<std::pair<uint64_t, uint32_t>> entries;
    for (const std::string& f : opt_.benchmarks) load(f, entries);
    table_.build(entries);
    std::sort(lengths_.begin(), lengths_.end(), std::greater<>());
    lengths_.erase(std::unique(lengths_.begin(), lengths_.end()), lengths_.end());
  }

  Verdict apply(Document& doc, Counters& counts) const override {
    thread_local std::vector<std::string_view> words;
    thread_local std::vector<uint64_t> hashes;
    thread_local std::vector<Hit> hits;
    words.clear();
    split_words(doc.text, words);
    folded_hashes(words, hashes);
    find_hits(hashes, !opt_.cut, hits);
    if (hits.empty()) return Verdict::kept();
    ++counts["contaminated"];
    std::string what = describe(hits.front(), words);
    if (!opt_.cut) return Verdict::removed(what);
    return cut(doc, words, hits, what);
  }

 private:
  void load(const std::string& path, std::vector<std::pair<uint64_t, uint32_t>>& entries) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::exists(path, ec)) fail("decontaminate: benchmark file '{}' does not exist", path);
    if (!fs::is_regular_file(path, ec)) fail("decontaminate: benchmark '{}' is not a file", path);
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("decontaminate: cannot read benchmark file '{}': {}", path, std::strerror(errno));
    uint32_t file = uint32_t(files_.size());
    files_.push_back(path);
    int jsonl = opt_.format == "jsonl" ? 1 : opt_.format == "text" ? 0 : -1;
    if (jsonl < 0 && (path.ends_with(".jsonl") || path.ends_with(".json"))) jsonl = 1;
    std::string line;
    std::vector<std::string_view> words;
    std::vector<uint64_t> hashes, grams;
    size_t before = samples_.size();
    for (uint32_t no = 1; std::getline(in, line); ++no) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (trim_space(line).empty()) continue;
      if (jsonl < 0) jsonl = trim_space(line).front() == '{' ? 1 : 0;
      std::string text;
      if (jsonl) {
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception& e) {
          fail("{}:{}: malformed JSON: {}", path, no, e.what());
        }
        if (!j.is_object()) fail("{}:{}: expected a JSON object", path, no);
        auto it = j.find(opt_.text_key);
        if (it == j.end() || !it->is_string())
          fail("{}:{}: no string field '{}' (set text_key)", path, no, opt_.text_key);
        text = it->get<std::string>();
      } else {
        text = line;
      }
      words.clear();
      split_words(text, words);
      if (words.empty()) continue;
      folded_hashes(words, hashes);
      uint32_t sample = uint32_t(samples_.size());
      samples_.push_back({file, no});
      // A sample shorter than n words is one n-gram of its own length.
      size_t len = std::min(words.size(), size_t(opt_.n));
      ngram_hashes(hashes, len, grams);
      for (uint64_t g : grams) entries.emplace_back(keyed(g, len), sample);
      lengths_.push_back(len);
    }
    if (in.bad()) fail("decontaminate: error reading benchmark file '{}'", path);
    if (samples_.size() == before) fail("decontaminate: benchmark file '{}' has no samples", path);
  }

  // The matches in word order (only the first when `first_only`).
  void find_hits(const std::vector<uint64_t>& hashes, bool first_only,
                 std::vector<Hit>& hits) const {
    thread_local std::vector<uint64_t> grams;
    hits.clear();
    for (size_t len : lengths_) {
      ngram_hashes(hashes, len, grams);
      size_t limit = grams.size();
      if (first_only && !hits.empty()) limit = std::min(limit, hits.front().word);
      for (size_t i = 0; i < limit; ++i) {
        int64_t s = table_.find(keyed(grams[i], len));
        if (s < 0) continue;
        if (first_only) {
          hits.assign(1, {i, len, uint32_t(s)});
          break;
        }
        hits.push_back({i, len, uint32_t(s)});
      }
    }
    std::stable_sort(hits.begin(), hits.end(),
                     [](const Hit& a, const Hit& b) { return a.word < b.word; });
  }

  std::string describe(const Hit& h, const std::vector<std::string_view>& words) const {
    std::string gram;
    for (size_t i = h.word; i < h.word + h.len; ++i) {
      if (!gram.empty()) gram.push_back(' ');
      gram.append(words[i]);
      if (gram.size() > 80) break;
    }
    if (gram.size() > 80) {
      size_t cut = 80;
      while (cut > 0 && (static_cast<unsigned char>(gram[cut]) & 0xC0) == 0x80) --cut;
      gram.resize(cut);
      gram += "...";
    }
    const Sample& s = samples_[h.sample];
    return fmt::format("contaminated: {}-gram of {}:{}: \"{}\"", h.len, files_[s.file], s.line,
                       gram);
  }

  // GPT-3 / NeMo TaskDecontamination: remove each match plus cut_context code
  // points on each side, widened to the nearest sentence end (. ! ?) outside
  // that; keep the pieces left of at least min_document_length code points,
  // joined by blank lines (NeMo makes each piece a document of its own). No
  // piece, or more than max_splits pieces, removes the document.
  Verdict cut(Document& doc, const std::vector<std::string_view>& words,
              const std::vector<Hit>& hits, const std::string& what) const {
    std::string_view t = doc.text;
    auto back = [&](size_t p, int k) {
      while (k-- > 0 && p > 0) {
        --p;
        while (p > 0 && (static_cast<unsigned char>(t[p]) & 0xC0) == 0x80) --p;
      }
      return p;
    };
    auto fwd = [&](size_t p, int k) {
      while (k-- > 0 && p < t.size()) {
        ++p;
        while (p < t.size() && (static_cast<unsigned char>(t[p]) & 0xC0) == 0x80) ++p;
      }
      return p;
    };
    // Removed byte ranges [l, r), increasing and disjoint.
    std::vector<std::pair<size_t, size_t>> cuts;
    for (const Hit& h : hits) {
      std::string_view last = words[h.word + h.len - 1];
      size_t b = size_t(words[h.word].data() - t.data());
      size_t e = size_t(last.data() + last.size() - t.data());
      bool have = !cuts.empty();
      size_t floor = have ? cuts.back().second : 0;
      bool merge = have && b < floor;
      if (!merge) {
        size_t q = back(b, opt_.cut_context);
        merge = have && q <= floor;
        if (!merge) {
          // Back to the sentence end at or before q (never into the previous cut).
          while (q > floor && !is_sentence_end(t[q])) --q;
          size_t l = is_sentence_end(t[q]) ? q + 1 : floor;
          merge = have && l <= floor;
          if (!merge) cuts.push_back({l, l});
        }
      }
      // Forward through the sentence end at or after p. Scans start at or past
      // the end of the cut so far, so the whole loop is linear.
      auto& c = cuts.back();
      size_t p = fwd(e, opt_.cut_context);
      if (p >= c.second) {
        while (p < t.size() && !is_sentence_end(t[p])) ++p;
        c.second = std::min(t.size(), p + 1);
      }
    }
    std::string out;
    size_t pieces = 0, at = 0;
    auto piece = [&](size_t from, size_t to) {
      std::string_view s = trim_space(t.substr(from, to - from));
      if (utf8_length(s) < size_t(opt_.min_document_length) || s.empty()) return;
      ++pieces;
      if (!out.empty()) out += "\n\n";
      out.append(s);
    };
    for (const auto& [l, r] : cuts) {
      piece(at, l);
      at = r;
    }
    piece(at, t.size());
    if (pieces == 0) return Verdict::removed(what + "; nothing long enough left after cutting");
    if (pieces > size_t(opt_.max_splits))
      return Verdict::removed(
          fmt::format("{}; {} pieces > max_splits {}", what, pieces, opt_.max_splits));
    doc.text = std::move(out);
    return Verdict::kept();
  }

  DecontamOptions opt_;
  std::vector<std::string> files_;
  std::vector<Sample> samples_;
  std::vector<size_t> lengths_;  // n-gram lengths present, longest first
  NgramTable table_;
};

}  // namespace

std::unique_ptr<DocStage> make_decontam_stage(const DecontamOptions& opt) {
  return std::make_unique<DecontamStage>(opt);
}

void register_decontam_stages(StageRegistry& r) {
  r.add({"decontaminate",
         "remove (mode: drop) or cut out (mode: cut) text sharing a word 13-gram with "
         "benchmark samples (benchmarks: [files])",
         [](StageConfig& c) -> std::unique_ptr<DocStage> {
           DecontamOptions o;
           if (!c.bind("benchmarks", o.benchmarks, "benchmark files, one sample per line") ||
               o.benchmarks.empty())
             c.fail_key("benchmarks", "a list of benchmark files is required");
           c.bind("text_key", o.text_key, "the field of a JSONL benchmark's samples");
           c.bind("format", o.format, "of the benchmark files: auto, jsonl or text");
           if (o.format != "auto" && o.format != "jsonl" && o.format != "text")
             c.fail_key("format", fmt::format("expected auto, jsonl or text, got '{}'", o.format));
           c.bind("n", o.n, "word n-gram length a match needs");
           if (o.n < 1 || o.n > 1000) c.fail_key("n", fmt::format("expected 1..1000, got {}", o.n));
           std::string mode = "drop";
           c.bind("mode", mode, "drop (remove the document) or cut (remove the matches)");
           if (mode != "drop" && mode != "cut")
             c.fail_key("mode", fmt::format("expected drop or cut, got '{}'", mode));
           o.cut = mode == "cut";
           auto count = [&](const char* key, int& field, int lo, const char* doc) {
             c.bind(key, field, doc);
             if (field < lo || field > (1 << 30))
               c.fail_key(key, fmt::format("expected >= {}, got {}", lo, field));
           };
           count("cut_context", o.cut_context, 0, "mode cut: code points removed around a match");
           count("min_document_length", o.min_document_length, 0,
                 "mode cut: code points a piece needs to be kept");
           count("max_splits", o.max_splits, 1, "mode cut: more pieces than this remove it");
           try {
             return make_decontam_stage(o);
           } catch (const Error& e) {
             c.fail_key("benchmarks", e.what());
           }
         },
         nullptr});
}

}  // namespace nk::curate
