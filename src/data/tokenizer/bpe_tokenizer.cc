#include "data/tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "core/json.h"
#include "data/tokenizer/text_normalizer.h"
#include "data/utf8.h"

namespace nk {

namespace {

// Per-thread cache of merged pieces (words recur; their merges are the
// expensive part). Direct-mapped; entries carry the owning tokenizer's id,
// which is never reused, so tokenizers share the cache safely.
constexpr size_t kCachedPieceBytes = 30, kCachedPieceIds = 8, kCacheSlots = 4096;
struct PieceCacheEntry {
  uint64_t owner = 0;  // 0: empty
  uint64_t hash = 0;
  uint8_t len = 0, n = 0;
  char bytes[kCachedPieceBytes];
  int32_t ids[kCachedPieceIds];
};

PieceCacheEntry* thread_piece_cache() {
  thread_local std::unique_ptr<PieceCacheEntry[]> cache(new PieceCacheEntry[kCacheSlots]);
  return cache.get();
}

std::atomic<uint64_t> next_tokenizer_id{1};

}  // namespace

BpeTokenizer::BpeTokenizer(BpeVocab vocab)
    : vocab_(std::move(vocab)),
      ranks_(vocab_.tokens),
      pretok_(vocab_.pattern),
      id_(next_tokenizer_id.fetch_add(1)) {
  const std::string& name = vocab_.name;
  if (!ranks_.has_all_bytes()) fail("BPE vocabulary '{}': not every byte 0..255 is a token", name);
  specials_ = vocab_.specials;
  std::sort(specials_.begin(), specials_.end(),
            [](const auto& a, const auto& b) { return a.second < b.second; });
  vocab_size_ = int64_t(vocab_.tokens.size());
  const int64_t entries = int64_t(std::count_if(vocab_.tokens.begin(), vocab_.tokens.end(),
                                                [](const std::string& t) { return !t.empty(); })) +
                          int64_t(specials_.size());
  for (size_t i = 0; i < specials_.size(); ++i) {
    const auto& [text, id] = specials_[i];
    if (text.empty()) fail("BPE vocabulary '{}': special token {} has no text", name, id);
    check_vocab_id(id, entries, fmt::format("BPE vocabulary '{}': special token '{}'", name, text));
    if (size_t(id) < vocab_.tokens.size() && !vocab_.tokens[size_t(id)].empty())
      fail("BPE vocabulary '{}': special token '{}' has id {}, which is a token", name, text, id);
    if (i > 0 && specials_[i - 1].second == id)
      fail("BPE vocabulary '{}': special tokens '{}' and '{}' share id {}", name,
           specials_[i - 1].first, text, id);
    vocab_size_ = std::max(vocab_size_, int64_t(id) + 1);
    if (text == (vocab_.eod.empty() ? "<|endoftext|>" : vocab_.eod)) eod_id_ = id;
    if (!vocab_.bos.empty() && text == vocab_.bos) bos_id_ = id;
  }
  if (!vocab_.eod.empty() && eod_id_ < 0)
    fail("BPE vocabulary '{}': the end-of-document token '{}' is not a special token", name,
         vocab_.eod);
  if (!vocab_.bos.empty() && bos_id_ < 0)
    fail("BPE vocabulary '{}': the beginning-of-document token '{}' is not a special token", name,
         vocab_.bos);
  special_text_.assign(size_t(vocab_size_), nullptr);
  for (const auto& [text, id] : specials_) special_text_[size_t(id)] = &text;

  if (!vocab_.normalizer.empty())
    normalizer_ = TextNormalizer::from_json(
        parse_json(vocab_.normalizer, fmt::format("BPE vocabulary '{}': normalizer", name)), name);
  for (const auto& [text, id] : specials_) {
    const auto& n = vocab_.normalized_specials;
    if (std::find(n.begin(), n.end(), id) == n.end()) {
      raw_specials_.emplace_back(text, id);
      continue;
    }
    std::string matched = normalizer_ ? normalizer_->normalize(text) : text;
    if (!matched.empty()) normalized_specials_.emplace_back(std::move(matched), id);
  }
  for (int32_t id : vocab_.normalized_specials)
    if (id < 0 || id >= vocab_size_ || !special_text_[size_t(id)])
      fail("BPE vocabulary '{}': normalized special {} is not a special token", name, id);
}

BpeTokenizer::~BpeTokenizer() = default;

const std::string* BpeTokenizer::bytes_of(int32_t id) const {
  if (id < 0 || id >= vocab_size_) return nullptr;
  if (size_t(id) < vocab_.tokens.size() && !vocab_.tokens[size_t(id)].empty())
    return &vocab_.tokens[size_t(id)];
  return special_text_[size_t(id)];
}

void BpeTokenizer::encode_valid(std::string_view text, std::vector<int32_t>& out) const {
  PieceCacheEntry* cache = thread_piece_cache();
  pretok_.for_each_piece_valid(text, [&](std::string_view piece) {
    int32_t r = ranks_.find(piece);
    if (r >= 0) return out.push_back(r);  // tiktoken's shortcut: a whole token
    if (piece.size() > kCachedPieceBytes) return bpe_merge_piece(piece, ranks_, out);
    uint64_t h = hash_bytes(piece.data(), piece.size());
    PieceCacheEntry& e = cache[h & (kCacheSlots - 1)];
    if (e.owner == id_ && e.hash == h && e.len == piece.size() &&
        std::memcmp(e.bytes, piece.data(), piece.size()) == 0)
      return out.insert(out.end(), e.ids, e.ids + e.n), void();
    size_t before = out.size();
    bpe_merge_piece(piece, ranks_, out);
    size_t n = out.size() - before;
    if (n > kCachedPieceIds) return;
    e.owner = id_, e.hash = h, e.len = uint8_t(piece.size()), e.n = uint8_t(n);
    std::memcpy(e.bytes, piece.data(), piece.size());
    std::memcpy(e.ids, out.data() + before, n * sizeof(int32_t));
  });
}

void BpeTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  std::string fixed;
  if (find_invalid_utf8(text) >= 0) {
    fixed = replace_invalid_utf8(text);
    text = fixed;
  }
  if (!normalizer_) return encode_valid(text, out);
  encode_valid(normalizer_->normalize(text), out);
}

void BpeTokenizer::encode_run(std::string_view text, std::vector<int32_t>& out) const {
  if (!normalizer_ && normalized_specials_.empty()) return encode_valid(text, out);
  const std::string normalized = normalizer_ ? normalizer_->normalize(text) : std::string(text);
  split_on_specials(
      normalized, normalized_specials_, [&](std::string_view t) { encode_valid(t, out); },
      [&](int32_t id) { out.push_back(id); });
}

void BpeTokenizer::encode_with_specials(std::string_view text, std::vector<int32_t>& out) const {
  std::string fixed;
  if (find_invalid_utf8(text) >= 0) {
    fixed = replace_invalid_utf8(text);
    text = fixed;
  }
  split_on_specials(
      text, raw_specials_, [&](std::string_view t) { encode_run(t, out); },
      [&](int32_t id) { out.push_back(id); });
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size() * 4);
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string* b = bytes_of(ids[i]);
    if (!b)
      fail("tokenizer '{}': id {} at position {} is not in the vocabulary (size {})", vocab_.name,
           ids[i], i, vocab_size_);
    out += *b;
  }
  return out;
}

std::string BpeTokenizer::token_bytes(int32_t id) const {
  const std::string* b = bytes_of(id);
  if (!b)
    fail("tokenizer '{}': id {} is not in the vocabulary (size {})", vocab_.name, id, vocab_size_);
  return *b;
}

std::vector<std::pair<std::string, int32_t>> BpeTokenizer::special_tokens() const {
  return specials_;
}

}  // namespace nk
