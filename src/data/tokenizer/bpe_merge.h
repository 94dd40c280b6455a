// The core of byte-level BPE: a hash map from token bytes to rank, and the
// merge loop that splits one pre-tokenized piece into tokens.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace nk {

// Token bytes -> rank, open addressing on a 64-bit hash. Keys live in one
// arena for locality. Immutable once built, so lookups are thread-safe.
class RankMap {
 public:
  RankMap() = default;
  // tokens[r] is the token of rank r; empty strings are holes (no token).
  // nk::Error naming both ranks if a token occurs twice.
  explicit RankMap(const std::vector<std::string>& tokens);
  // Rank of `bytes`, or -1 if it is not a token.
  int32_t find(std::string_view bytes) const;
  // Rank of the single byte b (every byte must be a token: see has_all_bytes).
  int32_t byte_rank(unsigned char b) const { return byte_rank_[b]; }
  bool has_all_bytes() const;

 private:
  // 16 bytes: most tokens are at most 8 bytes and compare without touching
  // the arena (one cache miss per lookup instead of three).
  struct Slot {
    uint64_t head = 0;  // the first 8 bytes of the token, zero-padded
    int32_t rank = -1;  // -1: empty slot
    uint16_t len = 0;
    uint16_t tag = 0;  // high bits of the hash
  };
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  std::vector<int32_t> pair_rank_;  // 65536: rank of every 2-byte string, or -1
  std::string arena_;
  std::vector<uint32_t> offset_;  // offset_[r], offset_[r+1] bound token r in arena_
  int32_t byte_rank_[256];
};

// The 64-bit hash RankMap uses (exposed for caches keyed by byte strings).
uint64_t hash_bytes(const char* p, size_t n);

constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();

// Appends to `out` the ranks that tiktoken's BPE gives `piece`: start from
// single bytes, repeatedly merge the adjacent pair whose concatenation is the
// token of lowest rank (leftmost on ties) while that rank is < max_rank.
// Every byte of `piece` must be a token. O(n^2) for short pieces as in
// tiktoken, a heap for longer ones (same result).
void bpe_merge_piece(std::string_view piece, const RankMap& ranks, std::vector<int32_t>& out,
                     int32_t max_rank = kNoRank);

}  // namespace nk
