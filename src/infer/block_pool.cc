#include "infer/block_pool.h"

#include <xxhash.h>

#include <algorithm>

#include "core/error.h"

namespace nk {

BlockPool::BlockPool(int64_t blocks, int64_t block_size)
    : B_(block_size),
      refs_(size_t(blocks), 0),
      registered_(size_t(blocks), 0),
      hash_(size_t(blocks), 0),
      parent_(size_t(blocks), 0),
      tokens_(size_t(blocks * block_size), 0),
      lru_pos_(size_t(blocks)) {
  NK_CHECK(blocks > 0 && block_size > 0, "BlockPool: {} blocks of {}", blocks, block_size);
  for (int64_t b = blocks - 1; b >= 0; --b) free_.push_back(int32_t(b));
}

uint64_t BlockPool::chain_hash(uint64_t parent, std::span<const int32_t> ids) {
  return XXH3_64bits_withSeed(ids.data(), ids.size_bytes(), parent);
}

void BlockPool::forget(int32_t b) {
  auto it = by_hash_.find(hash_[size_t(b)]);
  if (it != by_hash_.end() && it->second == b) by_hash_.erase(it);
  registered_[size_t(b)] = 0;
}

int32_t BlockPool::allocate() {
  int32_t b = -1;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    b = lru_.front();
    lru_.pop_front();
    forget(b);
  } else {
    return -1;
  }
  refs_[size_t(b)] = 1;
  ++used_;
  return b;
}

void BlockPool::release(int32_t b) {
  NK_CHECK(b >= 0 && b < int32_t(refs_.size()) && refs_[size_t(b)] > 0,
           "BlockPool::release: block {} is not held", b);
  if (--refs_[size_t(b)] > 0) return;
  --used_;
  if (registered_[size_t(b)]) {
    lru_pos_[size_t(b)] = lru_.insert(lru_.end(), b);
  } else {
    free_.push_back(b);
  }
}

int32_t BlockPool::lookup(uint64_t h, uint64_t parent, std::span<const int32_t> ids) {
  NK_CHECK(int64_t(ids.size()) == B_, "BlockPool::lookup: {} ids for a block of {}", ids.size(),
           B_);
  auto it = by_hash_.find(h);
  if (it == by_hash_.end()) return -1;
  const int32_t b = it->second;
  if (parent_[size_t(b)] != parent ||
      !std::equal(ids.begin(), ids.end(), tokens_.begin() + int64_t(b) * B_))
    return -1;
  if (refs_[size_t(b)]++ == 0) {
    lru_.erase(lru_pos_[size_t(b)]);
    ++used_;
  }
  return b;
}

void BlockPool::register_full(int32_t b, uint64_t h, uint64_t parent,
                              std::span<const int32_t> ids) {
  NK_CHECK(refs_[size_t(b)] > 0 && int64_t(ids.size()) == B_,
           "BlockPool::register_full: block {} ({} holders, {} ids)", b, refs_[size_t(b)],
           ids.size());
  if (registered_[size_t(b)] || by_hash_.count(h)) return;
  registered_[size_t(b)] = 1;
  hash_[size_t(b)] = h;
  parent_[size_t(b)] = parent;
  std::copy(ids.begin(), ids.end(), tokens_.begin() + int64_t(b) * B_);
  by_hash_.emplace(h, b);
}

}  // namespace nk
