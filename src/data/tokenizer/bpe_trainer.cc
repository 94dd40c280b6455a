#include "data/tokenizer/bpe_trainer.h"

#include <algorithm>
#include <mutex>
#include <queue>

#include "core/error.h"
#include "core/log.h"
#include "core/parallel.h"
#include "data/dataset/text_dataset.h"
#include "data/tokenizer/bpe_files.h"
#include "data/tokenizer/pretokenizer.h"
#include "data/utf8.h"

namespace nk {
namespace {

using PairKey = uint64_t;  // left id << 32 | right id
PairKey key_of(int32_t a, int32_t b) {
  return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
}
int32_t left_of(PairKey k) {
  return int32_t(k >> 32);
}
int32_t right_of(PairKey k) {
  return int32_t(k & 0xffffffffu);
}

struct Word {
  std::vector<int32_t> sym;
  int64_t count;
};

// Max-heap order: higher count first, then lower key. Entries go stale when a
// count changes; a popped entry is used only if it matches the current count.
struct HeapEntry {
  int64_t count;
  PairKey key;
  bool operator<(const HeapEntry& o) const {
    return count != o.count ? count < o.count : key > o.key;
  }
};

std::string default_pattern(const BpeTrainOptions& opt) {
  return opt.pattern.empty() ? openai_pattern("cl100k_base") : opt.pattern;
}

}  // namespace

PieceCounts count_pieces(const std::vector<std::string_view>& texts, const std::string& pattern,
                         int threads) {
  PreTokenizer pre(pattern);
  // Work units of ~1 MB cut at line ends, so two threads share one big text.
  std::vector<std::string_view> units;
  for (std::string_view t : texts) {
    while (!t.empty()) {
      size_t cut = std::min<size_t>(t.size(), size_t(1) << 20);
      if (cut < t.size()) {
        size_t nl = t.find('\n', cut);
        cut = nl == std::string_view::npos ? t.size() : nl + 1;
      }
      units.push_back(t.substr(0, cut));
      t.remove_prefix(cut);
    }
  }
  if (threads > 0) set_num_threads(threads);
  PieceCounts total;
  std::mutex mu;
  parallel_for(int64_t(units.size()), 1, [&](int64_t begin, int64_t end) {
    PieceCounts mine;
    std::string fixed;
    for (int64_t u = begin; u < end; ++u) {
      std::string_view text = units[size_t(u)];
      if (find_invalid_utf8(text) >= 0) {
        fixed = replace_invalid_utf8(text);
        text = fixed;
      }
      pre.for_each_piece_valid(text, [&](std::string_view piece) { ++mine[std::string(piece)]; });
    }
    std::lock_guard<std::mutex> lock(mu);
    if (total.empty()) {
      total = std::move(mine);
    } else {
      for (auto& [piece, n] : mine) total[piece] += n;
    }
  });
  return total;
}

BpeVocab train_bpe_from_files(const std::vector<std::string>& files, const BpeTrainOptions& opt,
                              int64_t max_bytes,
                              const std::function<void(int64_t, int64_t)>& on_merge) {
  if (files.empty()) fail("BPE training: no input files");
  std::vector<std::string> contents;
  std::vector<std::string_view> views;
  int64_t left = max_bytes;
  for (auto& f : files) {
    if (max_bytes > 0 && left <= 0) break;
    contents.push_back(read_text_file(f, max_bytes > 0 ? left : 0));
    left -= int64_t(contents.back().size());
  }
  for (auto& c : contents) views.push_back(c);
  BpeTrainOptions o = opt;
  o.pattern = default_pattern(opt);
  PieceCounts counts = count_pieces(views, o.pattern, opt.threads);
  NK_INFO("BPE training: {} distinct pieces; merging up to vocab_size {}", counts.size(),
          opt.vocab_size);
  return train_bpe(counts, o, on_merge);
}

BpeVocab train_bpe(const PieceCounts& counts, const BpeTrainOptions& opt,
                   const std::function<void(int64_t, int64_t)>& on_merge) {
  int64_t n_special = int64_t(opt.specials.size());
  if (opt.vocab_size < 256 + n_special)
    fail("vocab_size {} is below the 256 byte tokens plus {} special tokens", opt.vocab_size,
         n_special);
  BpeVocab v;
  v.name = opt.name;
  v.pattern = default_pattern(opt);
  for (int b = 0; b < 256; ++b) v.tokens.emplace_back(1, char(b));
  std::unordered_map<std::string, int32_t> id_of;
  for (int b = 0; b < 256; ++b) id_of[v.tokens[b]] = b;

  // Words sorted by bytes so that ids of words, and thus every tie, do not
  // depend on the hash map's iteration order.
  std::vector<const std::pair<const std::string, int64_t>*> sorted;
  sorted.reserve(counts.size());
  for (auto& kv : counts)
    if (kv.first.size() > 1) sorted.push_back(&kv);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->first < b->first; });
  std::vector<Word> words(sorted.size());
  std::unordered_map<PairKey, int64_t> pair_count;
  std::unordered_map<PairKey, std::vector<int32_t>> where;
  for (size_t w = 0; w < sorted.size(); ++w) {
    const std::string& s = sorted[w]->first;
    words[w].count = sorted[w]->second;
    words[w].sym.reserve(s.size());
    for (char c : s) words[w].sym.push_back(int32_t(uint8_t(c)));
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      PairKey k = key_of(words[w].sym[i], words[w].sym[i + 1]);
      pair_count[k] += words[w].count;
      auto& list = where[k];
      if (list.empty() || list.back() != int32_t(w)) list.push_back(int32_t(w));
    }
  }
  std::priority_queue<HeapEntry> heap;
  for (auto& [k, c] : pair_count) heap.push({c, k});

  int64_t want = opt.vocab_size - n_special - 256;
  std::vector<int64_t> stamp(words.size(), -1);
  std::unordered_map<PairKey, int64_t> delta;
  std::vector<int32_t> next;
  int32_t next_id = 256;
  int64_t merge_no = 0;  // pairs merged so far, counting repeats of a spelling
  for (int64_t m = 0; m < want && !heap.empty();) {
    HeapEntry top = heap.top();
    heap.pop();
    auto it = pair_count.find(top.key);
    if (it == pair_count.end() || it->second != top.count) continue;  // stale
    if (top.count < opt.min_frequency) break;
    int32_t a = left_of(top.key), b = right_of(top.key);
    std::string merged;
    merged.reserve(v.tokens[a].size() + v.tokens[b].size());
    merged.append(v.tokens[a]).append(v.tokens[b]);
    // Two merge paths can spell the same bytes ("ab"+"c", "a"+"bc"): one token.
    auto [id_it, fresh] = id_of.emplace(merged, next_id);
    int32_t id = id_it->second;
    if (fresh) {
      v.tokens.push_back(merged);
      ++next_id;
      ++m;
      if (on_merge) on_merge(m, want);
    }
    delta.clear();
    ++merge_no;
    std::vector<int32_t> ws = std::move(where[top.key]);
    where.erase(top.key);
    for (int32_t w : ws) {
      if (stamp[w] == merge_no) continue;  // listed twice
      stamp[w] = merge_no;
      Word& word = words[w];
      auto& s = word.sym;
      bool hit = false;
      for (size_t i = 0; i + 1 < s.size(); ++i) hit |= (s[i] == a && s[i + 1] == b);
      if (!hit) continue;
      for (size_t i = 0; i + 1 < s.size(); ++i) delta[key_of(s[i], s[i + 1])] -= word.count;
      next.clear();
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          next.push_back(id);
          i += 2;
        } else {
          next.push_back(s[i++]);
        }
      }
      s.swap(next);
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        PairKey k = key_of(s[i], s[i + 1]);
        delta[k] += word.count;
        if (s[i] == id || s[i + 1] == id) {
          auto& list = where[k];
          if (list.empty() || list.back() != w) list.push_back(w);
        }
      }
    }
    for (auto& [k, d] : delta) {
      if (d == 0) continue;
      int64_t& c = pair_count[k];
      c += d;
      if (c <= 0) {
        pair_count.erase(k);
      } else {
        heap.push({c, k});
      }
    }
  }
  int32_t sid = int32_t(v.tokens.size());
  for (auto& s : opt.specials) {
    if (id_of.count(s)) fail("special token '{}' is also an ordinary token", s);
    v.specials.emplace_back(s, sid++);
  }
  return v;
}

}  // namespace nk
