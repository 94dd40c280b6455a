#include "data/tokenizer/spm_bpe_tokenizer.h"

#include <algorithm>
#include <queue>

#include "core/error.h"
#include "core/json.h"
#include "data/tokenizer/text_normalizer.h"
#include "data/utf8.h"

namespace nk {

namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  for (size_t at; (at = s.find(from, pos)) != std::string::npos; pos = at + from.size())
    out.append(s, pos, at - pos).append(to);
  if (pos == 0) return;
  out.append(s, pos);
  s = std::move(out);
}

// Length of the UTF-8 character at s[i] (valid UTF-8).
size_t char_len(std::string_view s, size_t i) {
  const int n =
      utf8_sequence_length(reinterpret_cast<const unsigned char*>(s.data() + i), s.size() - i);
  return size_t(n > 0 ? n : 1);
}

// The word pieces of `text` cut at each `delim` (not empty): the delimiter
// kept with the piece after it (MergedWithNext), before it
// (MergedWithPrevious), on its own (Isolated) or dropped (Removed).
template <class F>
void split_literal(std::string_view text, std::string_view delim, SpmBpeSpec::Behavior b, F&& fn) {
  using B = SpmBpeSpec::Behavior;
  size_t start = 0, pos = 0;
  auto emit = [&](size_t from, size_t to) {
    if (to > from) fn(text.substr(from, to - from));
  };
  for (size_t at; (at = text.find(delim, pos)) != std::string_view::npos;) {
    const size_t end = at + delim.size();
    switch (b) {
      case B::kMergedWithNext:
        emit(start, at), start = at;
        break;
      case B::kMergedWithPrevious:
        emit(start, end), start = end;
        break;
      case B::kIsolated:
        emit(start, at), emit(at, end), start = end;
        break;
      case B::kRemoved:
        emit(start, at), start = end;
        break;
    }
    pos = end;
  }
  emit(start, text.size());
}

}  // namespace

int SpmBpeTokenizer::byte_of_piece(std::string_view p) {
  if (p.size() != 6 || !p.starts_with("<0x") || p[5] != '>') return -1;
  int v = 0;
  for (char c : p.substr(3, 2)) {
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                         : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

SpmBpeTokenizer::SpmBpeTokenizer(SpmBpeSpec spec) : spec_(std::move(spec)) {
  const std::string& name = spec_.name;
  const int32_t n = int32_t(spec_.pieces.size());
  is_added_.assign(size_t(n), false);
  for (const auto& [text, id] : spec_.added) {
    if (id < 0 || id >= n)
      fail("tokenizer '{}': added token '{}' has id {}, outside the vocabulary", name, text, id);
    is_added_[size_t(id)] = true;
  }
  std::fill(std::begin(byte_id_), std::end(byte_id_), -1);
  id_of_.reserve(size_t(n));
  for (int32_t id = 0; id < n; ++id) {
    const std::string& p = spec_.pieces[size_t(id)];
    // Added tokens that are model pieces too (Llama's <s>, Gemma's runs of
    // "▁" or newlines) are pieces merges may make, as in Hugging Face's model.
    if (p.empty() ||
        (size_t(id) < spec_.in_model.size() ? !spec_.in_model[size_t(id)] : is_added_[size_t(id)]))
      continue;
    id_of_.emplace(p, id);
    if (const int b = byte_of_piece(p); b >= 0 && p.substr(3, 2) == fmt::format("{:02X}", b))
      byte_id_[b] = id;
  }
  if (spec_.unk >= n || (spec_.unk >= 0 && spec_.pieces[size_t(spec_.unk)].empty()))
    fail("tokenizer '{}': the unk id {} is not a piece", name, spec_.unk);
  merge_of_.reserve(spec_.merges.size());
  for (size_t r = 0; r < spec_.merges.size(); ++r) {
    const auto [a, b] = spec_.merges[r];
    if (a < 0 || a >= n || b < 0 || b >= n)
      fail("tokenizer '{}': merge {} joins an id outside the vocabulary", name, r);
    auto it = id_of_.find(spec_.pieces[size_t(a)] + spec_.pieces[size_t(b)]);
    if (it == id_of_.end())
      fail("tokenizer '{}': merge {} makes '{}{}', which is not a piece", name, r,
           spec_.pieces[size_t(a)], spec_.pieces[size_t(b)]);
    // A pair listed twice keeps its last rank, as Hugging Face's map does.
    merge_of_[pair_key(a, b)] = {int32_t(r), it->second};
  }
  if (!spec_.normalizer.empty())
    normalizer_ = TextNormalizer::from_json(
        parse_json(spec_.normalizer, fmt::format("tokenizer '{}': normalizer", name)), name);
  for (const auto& [text, id] : spec_.added) {
    const auto& norm = spec_.normalized_added;
    if (std::find(norm.begin(), norm.end(), id) == norm.end()) {
      raw_added_.emplace_back(text, id);
      continue;
    }
    std::string matched = normalizer_ ? normalizer_->normalize(text) : text;
    if (!matched.empty()) normalized_added_.emplace_back(std::move(matched), id);
  }
}

SpmBpeTokenizer::~SpmBpeTokenizer() = default;

// Hugging Face's BPE::merge_word: the characters as symbols, then merges by
// (rank, position) from a heap until no listed pair is left.
void SpmBpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (spec_.ignore_merges)
    if (auto it = id_of_.find(std::string(word)); it != id_of_.end())
      return out.push_back(it->second);
  struct Sym {
    int32_t id, prev, next;
    bool gone;
  };
  std::vector<Sym> syms;
  auto add = [&](int32_t id) {
    const int32_t at = int32_t(syms.size());
    syms.push_back({id, at - 1, -1, false});
    if (at > 0) syms[size_t(at - 1)].next = at;
  };
  int32_t pending_unk = -1;  // an unk not yet added (fuse_unk grows it)
  std::string ch;
  for (size_t i = 0; i < word.size();) {
    const size_t len = char_len(word, i);
    ch.assign(word.substr(i, len));
    i += len;
    if (auto it = id_of_.find(ch); it != id_of_.end()) {
      if (pending_unk >= 0) add(pending_unk), pending_unk = -1;
      add(it->second);
      continue;
    }
    if (spec_.byte_fallback &&
        std::all_of(ch.begin(), ch.end(), [&](char c) { return byte_id_[uint8_t(c)] >= 0; })) {
      // As Hugging Face: a pending unk is not added before these (it follows them).
      for (char c : ch) add(byte_id_[uint8_t(c)]);
      continue;
    }
    if (spec_.unk < 0) continue;  // no unk piece: the character is dropped
    if (pending_unk >= 0 && !spec_.fuse_unk) add(pending_unk);
    pending_unk = spec_.unk;
  }
  if (pending_unk >= 0) add(pending_unk);

  struct Merge {
    int32_t rank, pos, id;
    bool operator>(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Merge, std::vector<Merge>, std::greater<Merge>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || syms[size_t(pos)].next < 0) return;
    auto it =
        merge_of_.find(pair_key(syms[size_t(pos)].id, syms[size_t(syms[size_t(pos)].next)].id));
    if (it != merge_of_.end()) heap.push({it->second.first, pos, it->second.second});
  };
  for (int32_t p = 0; p + 1 < int32_t(syms.size()); ++p) push(p);
  while (!heap.empty()) {
    const Merge m = heap.top();
    heap.pop();
    Sym& left = syms[size_t(m.pos)];
    if (left.gone || left.next < 0) continue;
    Sym& right = syms[size_t(left.next)];
    // Stale: the pair at this position changed since it was queued.
    auto it = merge_of_.find(pair_key(left.id, right.id));
    if (it == merge_of_.end() || it->second.second != m.id) continue;
    left.id = m.id;
    right.gone = true;
    left.next = right.next;
    if (right.next >= 0) syms[size_t(right.next)].prev = m.pos;
    push(left.prev);
    push(m.pos);
  }
  for (int32_t p = syms.empty() ? -1 : 0; p >= 0; p = syms[size_t(p)].next)
    out.push_back(syms[size_t(p)].id);
}

void SpmBpeTokenizer::encode_normalized(std::string_view text, bool at_start,
                                        std::vector<int32_t>& out) const {
  if (text.empty()) return;
  switch (spec_.pre) {
    case SpmBpeSpec::Pre::kNone:
      return encode_word(text, out);
    case SpmBpeSpec::Pre::kSplit:
      return split_literal(text, spec_.split_literal, spec_.behavior,
                           [&](std::string_view w) { encode_word(w, out); });
    case SpmBpeSpec::Pre::kMetaspace:
      break;
  }
  const std::string& rep = spec_.replacement;
  std::string s(text);
  replace_all(s, " ", rep);
  using P = SpmBpeSpec::Prepend;
  if (!s.starts_with(rep) &&
      (spec_.prepend == P::kAlways || (spec_.prepend == P::kFirst && at_start)))
    s.insert(0, rep);
  if (!spec_.split) return encode_word(s, out);
  split_literal(s, rep, SpmBpeSpec::Behavior::kMergedWithNext,
                [&](std::string_view w) { encode_word(w, out); });
}

void SpmBpeTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  const std::string valid = replace_invalid_utf8(text);
  encode_normalized(normalizer_ ? normalizer_->normalize(valid) : valid, true, out);
}

void SpmBpeTokenizer::encode_with_specials(std::string_view text, std::vector<int32_t>& out) const {
  const std::string valid = replace_invalid_utf8(text);
  const std::string_view all(valid);
  auto on_added = [&](int32_t id) { out.push_back(id); };
  split_on_specials(
      all, raw_added_,
      [&](std::string_view run) {
        // Metaspace's "first" prepends only to the run at the start of the
        // text (Hugging Face: the run's original offset is 0).
        const bool at_start = run.data() == all.data();
        const std::string norm = normalizer_ ? normalizer_->normalize(run) : std::string(run);
        const std::string_view n(norm);
        split_on_specials(
            n, normalized_added_,
            [&](std::string_view t) {
              encode_normalized(t, at_start && t.data() == n.data(), out);
            },
            on_added);
      },
      on_added);
}

void SpmBpeTokenizer::check_id(int32_t id, size_t position) const {
  if (id < 0 || id >= int32_t(spec_.pieces.size()) || spec_.pieces[size_t(id)].empty())
    fail("tokenizer '{}': id {} at position {} is not in the vocabulary (size {})", spec_.name, id,
         position, spec_.pieces.size());
}

std::string SpmBpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    check_id(ids[i], i);
    toks.push_back(spec_.pieces[size_t(ids[i])]);
  }
  using D = SpmBpeSpec::DecodeStep;
  for (const D& step : spec_.decoder) {
    switch (step.kind) {
      case D::kReplace:
        for (std::string& t : toks) replace_all(t, step.pattern, step.content);
        break;
      case D::kFuse: {
        std::string all;
        for (const std::string& t : toks) all += t;
        toks.assign(1, std::move(all));
        break;
      }
      case D::kStrip:
        for (std::string& t : toks) {
          size_t from = 0, to = t.size();
          for (size_t k = 0; k < step.start &&
                             t.compare(from, step.content.size(), step.content) == 0 && from < to;
               ++k)
            from += step.content.size();
          for (size_t k = 0;
               k < step.stop && to >= from + step.content.size() &&
               t.compare(to - step.content.size(), step.content.size(), step.content) == 0;
               ++k)
            to -= step.content.size();
          t = t.substr(from, to - from);
        }
        break;
      case D::kMetaspace:
        for (size_t i = 0; i < toks.size(); ++i)
          replace_all(toks[i], step.pattern, i == 0 && step.drop_first ? "" : " ");
        break;
      case D::kByteFallback: {
        std::vector<std::string> merged;
        std::string bytes;
        size_t run = 0;
        auto flush = [&] {
          if (run == 0) return;
          if (find_invalid_utf8(bytes) < 0) {
            merged.push_back(bytes);
          } else {
            for (size_t k = 0; k < run; ++k) merged.push_back("\uFFFD");
          }
          bytes.clear(), run = 0;
        };
        for (std::string& t : toks) {
          if (const int b = byte_of_piece(t); b >= 0) {
            bytes.push_back(char(b)), ++run;
            continue;
          }
          flush();
          merged.push_back(std::move(t));
        }
        flush();
        toks = std::move(merged);
        break;
      }
    }
  }
  std::string out;
  for (const std::string& t : toks) out += t;
  return out;
}

std::string SpmBpeTokenizer::token_bytes(int32_t id) const {
  check_id(id, 0);
  std::string p = spec_.pieces[size_t(id)];
  if (const int b = byte_of_piece(p); b >= 0 && !is_added_[size_t(id)])
    return std::string(1, char(b));
  // Added tokens too, as Hugging Face's decoder sees them (Gemma's "▁▁").
  replace_all(p, spec_.replacement, " ");
  return p;
}

std::vector<std::pair<std::string, int32_t>> SpmBpeTokenizer::special_tokens() const {
  auto out = spec_.added;
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.second < b.second; });
  return out;
}

}  // namespace nk
