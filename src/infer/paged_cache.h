// The paged KV cache: sequences hold fixed-size blocks of one pool through
// block tables (vLLM's PagedAttention layout), with prefix caching.
//
// A sequence takes blocks as it grows, so the pool holds as many sequences as
// their actual lengths allow, not as many as their worst cases. open() takes
// the blocks of the opened tokens at once (reusing cached prefix blocks) and
// refuses while that would leave fewer than `watermark` of the pool free with
// other sequences running (headroom for their decoding); append() takes a new
// block when a sequence crosses into one, and says false when the pool is
// exhausted: the generator then preempts a sequence (infer/generate.h).
// Full blocks are registered in the prefix cache once their keys and values
// are computed (after forward()).
#pragma once
#include <vector>

#include "infer/block_pool.h"
#include "infer/sequence_cache.h"

namespace nk {

struct PagedCacheOptions {
  int64_t block_size = 16;
  int64_t blocks = 0;      // the pool
  int64_t max_len = 0;     // positions per sequence (capped at blocks * block_size)
  int64_t max_seqs = 0;    // sequences one step may carry
  int64_t max_tokens = 0;  // new tokens one step may carry
  bool prefix_caching = true;
  double watermark = 0.01;  // fraction of the pool open() keeps free while others run
  KvDType kv_dtype;         // k and v: nullopt keeps them in the compute dtype
  int64_t tp = 1;           // the model's tensor-parallel ranks (KVCacheShape::tp)
  int64_t etp = 0;          // its experts' (KVCacheShape::etp; 0: tp)
};

class PagedCache final : public SequenceCache {
 public:
  PagedCache(const ModelConfig& cfg, DType compute, const PagedCacheOptions& opt,
             Device device = kHost);

  // Blocks that fit `mb` MiB of cache (k and v of every layer, in dtype kv;
  // a tensor-parallel rank's 1/tp of the heads: KVCache::block_bytes), at
  // least 1.
  static int64_t blocks_for_memory(const ModelConfig& cfg, DType kv, int64_t block_size, double mb,
                                   int64_t tp = 1);

  int64_t max_len() const override { return kv_.max_len(); }
  int64_t max_tokens() const override { return kv_.max_tokens(); }
  Opened open(int64_t len, std::span<const int32_t> ids) override;
  void close(int32_t seq) override;
  bool append(int32_t seq, int64_t first, std::span<const int32_t> ids, StepBuffer& step) override;
  void forward(Transformer& model, const StepBuffer& step, Tensor logits) override;
  int64_t blocks_used() const override { return pool_.used(); }
  int64_t blocks_total() const override { return pool_.total(); }

  const BlockPool& pool() const { return pool_; }
  const KVCache& kv() const override { return kv_; }
  // The blocks of an open sequence, in position order (for tests).
  const std::vector<int32_t>& blocks_of(int32_t seq) const;

 private:
  struct Seq {
    bool open = false;
    std::vector<int32_t> blocks;
    std::vector<int32_t> ids;      // every token placed so far, by position
    std::vector<uint64_t> hashes;  // chain hash of each full block registered or matched
    int64_t computed = 0;          // positions whose k and v are stored
    int64_t pending = 0;           // end of the positions appended to the current step
  };
  Seq& check_open(int32_t seq, const char* what);
  // Grows s to hold `len` positions; false (taking nothing) when the pool
  // cannot, or would keep fewer than `keep` blocks free.
  bool reserve(Seq& s, int64_t len, int64_t keep);
  void register_blocks(Seq& s);

  PagedCacheOptions opt_;
  KVCache kv_;
  BlockPool pool_;
  std::vector<Seq> seqs_;
  std::vector<int32_t> free_handles_;
  int64_t open_count_ = 0;
  std::vector<int32_t> table_, rows_;  // the step's block table and token rows
  std::vector<int32_t> in_step_;       // the step's sequences, by table row
  std::vector<int32_t> row_of_;        // per handle, its row in the step's table (-1: none)
};

}  // namespace nk
