#include "infer/paged_cache.h"

#include <algorithm>
#include <cmath>

namespace nk {

namespace {

KVCacheShape shape_of(const ModelConfig& cfg, const PagedCacheOptions& o) {
  NK_CHECK(o.block_size > 0 && o.blocks > 0 && o.max_len > 0 && o.max_seqs > 0 &&
               o.max_tokens > 0 && o.watermark >= 0 && o.watermark < 1,
           "PagedCache: block size {}, {} blocks, max_len {}, {} sequences, {} tokens, "
           "watermark {}",
           o.block_size, o.blocks, o.max_len, o.max_seqs, o.max_tokens, o.watermark);
  // A sequence alone in the pool must fit it.
  const int64_t len = std::min({o.max_len, o.blocks * o.block_size, cfg.max_seq_len});
  return KVCacheShape{o.blocks, o.block_size, len, o.max_seqs, o.max_tokens, o.tp, o.etp};
}

}  // namespace

int64_t PagedCache::blocks_for_memory(const ModelConfig& cfg, DType kv, int64_t block_size,
                                      double mb, int64_t tp) {
  const double per = double(KVCache::block_bytes(cfg, kv, block_size, tp));
  return std::max<int64_t>(1, int64_t(std::floor(mb * 1024 * 1024 / per)));
}

PagedCache::PagedCache(const ModelConfig& cfg, DType compute, const PagedCacheOptions& opt,
                       Device device)
    : opt_(opt),
      kv_(cfg, compute, shape_of(cfg, opt), device, opt.kv_dtype),
      pool_(opt.blocks, opt.block_size) {}

PagedCache::Seq& PagedCache::check_open(int32_t seq, const char* what) {
  NK_CHECK(seq >= 0 && seq < int32_t(seqs_.size()) && seqs_[size_t(seq)].open,
           "PagedCache::{}: sequence {} is not open", what, seq);
  return seqs_[size_t(seq)];
}

const std::vector<int32_t>& PagedCache::blocks_of(int32_t seq) const {
  NK_CHECK(seq >= 0 && seq < int32_t(seqs_.size()) && seqs_[size_t(seq)].open,
           "PagedCache::blocks_of: sequence {} is not open", seq);
  return seqs_[size_t(seq)].blocks;
}

bool PagedCache::reserve(Seq& s, int64_t len, int64_t keep) {
  const int64_t B = opt_.block_size, need = (len + B - 1) / B - int64_t(s.blocks.size());
  if (need <= 0) return true;
  if (pool_.available() - need < keep) return false;
  for (int64_t i = 0; i < need; ++i) s.blocks.push_back(pool_.allocate());
  return true;
}

SequenceCache::Opened PagedCache::open(int64_t len, std::span<const int32_t> ids) {
  const int64_t n = int64_t(ids.size()), B = opt_.block_size;
  NK_CHECK(len >= 1 && n >= 1 && n <= len, "PagedCache::open: {} ids for {} positions", n, len);
  if (len > max_len()) return {};
  Seq s;
  // The cached prefix: whole blocks, leaving at least the last id to compute
  // (its logits are wanted).
  uint64_t parent = BlockPool::kRootHash;
  if (opt_.prefix_caching)
    for (int64_t i = 0; (i + 1) * B <= n - 1; ++i) {
      std::span<const int32_t> blk = ids.subspan(size_t(i * B), size_t(B));
      const uint64_t h = BlockPool::chain_hash(parent, blk);
      const int32_t b = pool_.lookup(h, parent, blk);
      if (b < 0) break;
      s.blocks.push_back(b);
      s.hashes.push_back(h);
      parent = h;
    }
  const int64_t keep =
      open_count_ > 0 ? int64_t(std::ceil(opt_.watermark * double(pool_.total()))) : 0;
  if (!reserve(s, n, keep)) {
    for (int32_t b : s.blocks) pool_.release(b);
    return {};
  }
  s.open = true;
  s.ids.assign(ids.begin(), ids.end());
  s.computed = s.pending = int64_t(s.hashes.size()) * B;
  int32_t h;
  if (!free_handles_.empty()) {
    h = free_handles_.back();
    free_handles_.pop_back();
  } else {
    h = int32_t(seqs_.size());
    seqs_.emplace_back();
    row_of_.push_back(-1);
  }
  seqs_[size_t(h)] = std::move(s);
  ++open_count_;
  return {h, seqs_[size_t(h)].computed};
}

void PagedCache::close(int32_t seq) {
  Seq& s = check_open(seq, "close");
  // Last blocks first: a prefix's later blocks are reused before its first
  // ones, which more prompts share.
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) pool_.release(*it);
  s = Seq{};
  free_handles_.push_back(seq);
  --open_count_;
}

bool PagedCache::append(int32_t seq, int64_t first, std::span<const int32_t> ids,
                        StepBuffer& step) {
  Seq& s = check_open(seq, "append");
  const int64_t n = int64_t(ids.size());
  NK_CHECK(first == s.pending && first + n <= max_len(),
           "PagedCache::append: positions [{}, {}) of a sequence holding {} (of at most {})", first,
           first + n, s.pending, max_len());
  if (!reserve(s, first + n, 0)) return false;
  if (int64_t(s.ids.size()) < first + n) s.ids.resize(size_t(first + n));
  for (int64_t k = 0; k < n; ++k) {
    s.ids[size_t(first + k)] = ids[size_t(k)];
    step.tokens.push_back(ids[size_t(k)]);
    step.seqs.push_back(seq);
    step.positions.push_back(int32_t(first + k));
  }
  s.pending = first + n;
  return true;
}

void PagedCache::register_blocks(Seq& s) {
  const int64_t B = opt_.block_size;
  for (int64_t i = int64_t(s.hashes.size()); (i + 1) * B <= s.computed; ++i) {
    const uint64_t parent = i ? s.hashes[size_t(i - 1)] : BlockPool::kRootHash;
    std::span<const int32_t> blk(s.ids.data() + i * B, size_t(B));
    const uint64_t h = BlockPool::chain_hash(parent, blk);
    pool_.register_full(s.blocks[size_t(i)], h, parent, blk);
    s.hashes.push_back(h);
  }
}

void PagedCache::forward(Transformer& model, const StepBuffer& step, Tensor logits) {
  // One table row per sequence in the step, in order of first appearance.
  const int64_t M = kv_.shape().table_width();
  table_.clear();
  rows_.clear();
  in_step_.clear();
  for (int32_t h : step.seqs) {
    if (row_of_[size_t(h)] < 0) {
      row_of_[size_t(h)] = int32_t(in_step_.size());
      in_step_.push_back(h);
      const std::vector<int32_t>& b = seqs_[size_t(h)].blocks;
      table_.insert(table_.end(), b.begin(), b.end());
      table_.resize(in_step_.size() * size_t(M), 0);  // unread past the length
    }
    rows_.push_back(row_of_[size_t(h)]);
  }
  for (int32_t h : in_step_) row_of_[size_t(h)] = -1;
  model.forward_cached(kv_, CachedStep{step.tokens, rows_, step.positions, step.logit_rows, table_},
                       logits);
  for (int32_t h : in_step_) {
    Seq& s = seqs_[size_t(h)];
    s.computed = s.pending;
    if (opt_.prefix_caching) register_blocks(s);
  }
}

}  // namespace nk
