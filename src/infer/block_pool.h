// The block pool of a paged KV cache: which blocks are free, who holds them
// (reference counts), and the prefix cache over them.
//
// Prefix caching: a full block is registered under the hash of its tokens and
// of every token before it (a chain: h_i = hash(h_{i-1}, block i's tokens)),
// so a new sequence whose prompt starts with the same tokens takes those
// blocks instead of computing them again. A registered block whose last holder
// lets go stays cached; cached blocks are reused least recently released
// first, and only when no never-registered block is free. A lookup checks the
// stored tokens and parent hash too: a hash collision never shares a block.
#pragma once
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace nk {

class BlockPool {
 public:
  static constexpr uint64_t kRootHash = 0x9e3779b97f4a7c15ull;  // the parent hash of block 0

  BlockPool(int64_t blocks, int64_t block_size);

  int64_t total() const { return int64_t(refs_.size()); }
  int64_t block_size() const { return B_; }
  int64_t used() const { return used_; }                   // blocks with holders
  int64_t cached() const { return int64_t(lru_.size()); }  // held by none, prefix kept
  int64_t available() const { return total() - used_; }    // allocatable now

  // A block with one holder: a free one, else the least recently released
  // cached one (its prefix forgotten); -1 when every block is held.
  int32_t allocate();
  // Drops one holder. At none, a registered block is kept as cached (the
  // most recently released), any other becomes free.
  void release(int32_t block);
  int32_t holders(int32_t block) const { return refs_[size_t(block)]; }

  // The hash of a block holding `ids` (block_size tokens) after a prefix of
  // hash `parent` (kRootHash for the first block).
  static uint64_t chain_hash(uint64_t parent, std::span<const int32_t> ids);
  // The block registered as holding `ids` after `parent` (hash h, as
  // chain_hash gives), taking a holder; -1 when there is none.
  int32_t lookup(uint64_t h, uint64_t parent, std::span<const int32_t> ids);
  // Registers held, full `block` as holding `ids` after `parent`, unless that
  // prefix is registered already (another block computed it too: this one
  // stays private) or the block is.
  void register_full(int32_t block, uint64_t h, uint64_t parent, std::span<const int32_t> ids);

 private:
  void forget(int32_t block);  // drops a block's registration

  int64_t B_;
  int64_t used_ = 0;
  std::vector<int32_t> refs_;
  std::vector<uint8_t> registered_;
  std::vector<uint64_t> hash_, parent_;
  std::vector<int32_t> tokens_;  // [blocks, B]: a registered block's tokens
  std::vector<std::list<int32_t>::iterator> lru_pos_;
  std::list<int32_t> lru_;     // cached blocks, least recently released first
  std::vector<int32_t> free_;  // a stack of never-registered (or forgotten) free blocks
  std::unordered_map<uint64_t, int32_t> by_hash_;
};

}  // namespace nk
