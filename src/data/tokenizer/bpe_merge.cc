#include "data/tokenizer/bpe_merge.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <queue>
#include <utility>

#include "core/error.h"

namespace nk {

namespace {

inline uint64_t hash_bytes_inline(const char* p, size_t n) {
  constexpr uint64_t kMul = 0x9FB21C651E98DF25ull;
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t(n) * 0xFF51AFD7ED558CCDull);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * kMul;
    h ^= h >> 29;
    p += 8, n -= 8;
  }
  if (n) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * kMul;
    h ^= h >> 29;
  }
  h *= 0xD6E8FEB86659FD93ull;
  return h ^ (h >> 32);
}

}  // namespace

uint64_t hash_bytes(const char* p, size_t n) {
  return hash_bytes_inline(p, n);
}

namespace {

inline uint64_t head_of(const char* p, size_t n) {
  uint64_t w = 0;
  std::memcpy(&w, p, n < 8 ? n : 8);
  return w;
}

}  // namespace

RankMap::RankMap(const std::vector<std::string>& tokens) {
  size_t count = 0, bytes = 0;
  for (const auto& t : tokens) count += !t.empty(), bytes += t.size();
  size_t cap = 16;
  while (cap < count * 2) cap *= 2;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  arena_.reserve(bytes);
  offset_.resize(tokens.size() + 1);
  for (auto& r : byte_rank_) r = -1;
  for (size_t r = 0; r < tokens.size(); ++r) {
    offset_[r] = uint32_t(arena_.size());
    arena_ += tokens[r];
  }
  offset_[tokens.size()] = uint32_t(arena_.size());
  for (size_t r = 0; r < tokens.size(); ++r) {
    const std::string& t = tokens[r];
    if (t.empty()) continue;
    uint64_t h = hash_bytes_inline(t.data(), t.size());
    for (uint64_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.rank < 0) {
        s.head = head_of(t.data(), t.size());
        s.rank = int32_t(r);
        s.len = uint16_t(std::min<size_t>(t.size(), 0xFFFF));
        s.tag = uint16_t(h >> 48);
        break;
      }
      if (tokens[size_t(s.rank)] == t)
        fail("BPE vocabulary: token of rank {} repeats the token of rank {}", r, s.rank);
    }
    if (t.size() == 1) byte_rank_[static_cast<unsigned char>(t[0])] = int32_t(r);
  }
  pair_rank_.assign(65536, -1);
  for (size_t r = 0; r < tokens.size(); ++r)
    if (tokens[r].size() == 2)
      pair_rank_[static_cast<unsigned char>(tokens[r][0]) |
                 size_t(static_cast<unsigned char>(tokens[r][1])) << 8] = int32_t(r);
}

bool RankMap::has_all_bytes() const {
  for (int32_t r : byte_rank_)
    if (r < 0) return false;
  return true;
}

int32_t RankMap::find(std::string_view b) const {
  if (slots_.empty()) return -1;
  if (b.size() == 1) return byte_rank_[static_cast<unsigned char>(b[0])];
  if (b.size() == 2)
    return pair_rank_[static_cast<unsigned char>(b[0]) | size_t(static_cast<unsigned char>(b[1]))
                                                             << 8];
  uint64_t h = hash_bytes_inline(b.data(), b.size());
  uint16_t tag = uint16_t(h >> 48);
  uint64_t head = head_of(b.data(), b.size());
  size_t n = b.size();
  for (uint64_t i = h & mask_;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.rank < 0) return -1;
    if (s.tag == tag && s.head == head && s.len == std::min<size_t>(n, 0xFFFF)) {
      if (n <= 8) return s.rank;
      uint32_t o = offset_[size_t(s.rank)], e = offset_[size_t(s.rank) + 1];
      if (e - o == n && std::memcmp(arena_.data() + o + 8, b.data() + 8, n - 8) == 0) return s.rank;
    }
  }
}

namespace {

// Rank of piece[b, e) if it is a token below max_rank, else kNoRank.
inline int32_t rank_of(std::string_view piece, size_t b, size_t e, const RankMap& ranks,
                       int32_t max_rank) {
  int32_t r = ranks.find(piece.substr(b, e - b));
  return r >= 0 && r < max_rank ? r : kNoRank;
}

// Pieces up to this length take the quadratic scan (no allocation); longer
// ones (runs of CJK, spaces, digits) the heap.
constexpr size_t kSmallPiece = 64;

// tiktoken's loop: parts[i] = (start of part i, rank of part i merged with i+1).
void merge_small(std::string_view piece, const RankMap& ranks, std::vector<int32_t>& out,
                 int32_t max_rank) {
  constexpr size_t kMax = kSmallPiece;
  size_t n = piece.size();
  uint32_t start[kMax + 1];
  int32_t pair[kMax + 1];
  for (size_t i = 0; i <= n; ++i) start[i] = uint32_t(i);
  for (size_t i = 0; i + 1 < n; ++i) pair[i] = rank_of(piece, i, i + 2, ranks, max_rank);
  pair[n - 1] = pair[n] = kNoRank;
  size_t m = n;  // parts; start[m] == n is the end sentinel
  while (m > 1) {
    int32_t best = kNoRank;
    size_t at = 0;
    for (size_t i = 0; i + 1 < m; ++i)
      if (pair[i] < best) best = pair[i], at = i;
    if (best == kNoRank) break;
    // Part `at` absorbs part at+1; refresh the pair ranks that touch it.
    pair[at] = at + 2 < m ? rank_of(piece, start[at], start[at + 3], ranks, max_rank) : kNoRank;
    if (at > 0) pair[at - 1] = rank_of(piece, start[at - 1], start[at + 2], ranks, max_rank);
    for (size_t i = at + 1; i < m; ++i) start[i] = start[i + 1], pair[i] = pair[i + 1];
    --m;
  }
  for (size_t i = 0; i < m; ++i) {
    int32_t r = ranks.find(piece.substr(start[i], start[i + 1] - start[i]));
    NK_CHECK(r >= 0, "BPE part is not a token");
    out.push_back(r);
  }
}

// The same merges with a linked list of parts and a min-heap of (rank, start);
// stale heap entries are skipped when the part's current pair rank differs.
void merge_large(std::string_view piece, const RankMap& ranks, std::vector<int32_t>& out,
                 int32_t max_rank) {
  size_t n = piece.size();
  std::vector<uint32_t> next(n);
  std::vector<int32_t> prev(n), pair(n, kNoRank);
  std::vector<bool> alive(n, true);
  using Entry = std::pair<int32_t, uint32_t>;
  std::vector<Entry> heap_store;
  heap_store.reserve(n);
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap(std::greater<Entry>(),
                                                                           std::move(heap_store));
  for (size_t i = 0; i < n; ++i) {
    next[i] = uint32_t(i + 1);
    prev[i] = int32_t(i) - 1;
    if (i + 1 < n) {
      pair[i] = rank_of(piece, i, i + 2, ranks, max_rank);
      if (pair[i] != kNoRank) heap.push({pair[i], uint32_t(i)});
    }
  }
  auto refresh = [&](size_t i) {
    size_t j = next[i];
    pair[i] = j < n ? rank_of(piece, i, next[j], ranks, max_rank) : kNoRank;
    if (pair[i] != kNoRank) heap.push({pair[i], uint32_t(i)});
  };
  while (!heap.empty()) {
    auto [r, i] = heap.top();
    heap.pop();
    if (!alive[i] || pair[i] != r) continue;
    size_t j = next[i];
    alive[j] = false;
    next[i] = next[j];
    if (next[j] < n) prev[next[j]] = int32_t(i);
    refresh(i);
    if (prev[i] >= 0) refresh(size_t(prev[i]));
  }
  for (size_t i = 0; i < n; i = next[i]) {
    int32_t r = ranks.find(piece.substr(i, next[i] - i));
    NK_CHECK(r >= 0, "BPE part is not a token");
    out.push_back(r);
  }
}

}  // namespace

void bpe_merge_piece(std::string_view piece, const RankMap& ranks, std::vector<int32_t>& out,
                     int32_t max_rank) {
  if (piece.empty()) return;
  if (piece.size() == 1) {
    out.push_back(ranks.byte_rank(static_cast<unsigned char>(piece[0])));
    return;
  }
  if (piece.size() <= kSmallPiece)
    merge_small(piece, ranks, out, max_rank);
  else
    merge_large(piece, ranks, out, max_rank);
}

}  // namespace nk
