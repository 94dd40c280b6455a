// How inference reaches KV-cache memory: per sequence, through a handle.
//
// A sequence is opened with the number of positions it may come to hold,
// gets its new tokens placed into a step by append() (which writes their
// cache addresses), and is closed to give its memory back. The generator never
// computes a cache address itself, so a paged cache (block tables over a pool
// of fixed-size blocks, CachedStep carrying what its attention needs)
// replaces SlotCache by implementing the same five calls.
#pragma once
#include <span>
#include <vector>

#include "model/kv_cache.h"
#include "model/transformer.h"

namespace nk {

// Host buffers of one forward_cached call under construction.
struct StepBuffer {
  std::vector<int32_t> tokens, slots, positions;  // one entry per new token
  std::vector<int32_t> logit_rows;                // indexes into tokens
  void clear();
  CachedStep view() const { return CachedStep{tokens, slots, positions, logit_rows}; }
};

class SequenceCache {
 public:
  static constexpr int32_t kNoRoom = -1;
  virtual ~SequenceCache() = default;

  // Most positions one sequence can hold (its prompt and generated tokens
  // but the last, which is never fed back).
  virtual int64_t max_len() const = 0;
  // Most new tokens one step may carry (decode tokens plus prompt chunks).
  virtual int64_t max_tokens() const = 0;
  // A handle for a new sequence of at most `len` positions, or kNoRoom while
  // the cache cannot take it (closing sequences makes room; a len over
  // max_len() never fits).
  virtual int32_t open(int64_t len) = 0;
  // Gives an open sequence's memory back; the handle is invalid afterwards.
  virtual void close(int32_t seq) = 0;
  // Appends `ids`, the tokens at positions [first, first + ids.size()) of an
  // open sequence, to step with their cache addresses.
  virtual void append(int32_t seq, int64_t first, std::span<const int32_t> ids,
                      StepBuffer& step) const = 0;
  // Runs model over step's tokens: stores their keys and values at their
  // addresses and writes the logits f32 [R, V] of its R logit rows.
  virtual void forward(Transformer& model, const StepBuffer& step, Tensor logits) = 0;
};

// The contiguous cache: each sequence owns one slot of a KVCache, positions
// 0..max_len-1 of it. Free slots are handed out lowest first and a closed
// slot is the next one reused.
class SlotCache final : public SequenceCache {
 public:
  // slots: sequences held at once; max_len, max_tokens, device: as in KVCache.
  SlotCache(const ModelConfig& cfg, DType compute, int64_t slots, int64_t max_len,
            int64_t max_tokens, Device device = kHost);

  int64_t slots() const { return cache_.slots(); }
  int64_t free_slots() const { return int64_t(free_.size()); }
  const KVCache& kv() const { return cache_; }

  int64_t max_len() const override { return cache_.max_len(); }
  int64_t max_tokens() const override { return cache_.max_tokens(); }
  int32_t open(int64_t len) override;
  void close(int32_t seq) override;
  void append(int32_t seq, int64_t first, std::span<const int32_t> ids,
              StepBuffer& step) const override;
  void forward(Transformer& model, const StepBuffer& step, Tensor logits) override;

 private:
  void check_open(int32_t seq, const char* what) const;

  KVCache cache_;
  std::vector<int32_t> free_;  // a stack: the next slot handed out is free_.back()
  std::vector<uint8_t> open_;  // per slot
};

}  // namespace nk
