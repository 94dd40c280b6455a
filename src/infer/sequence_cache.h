// How inference reaches KV-cache memory: per sequence, through a handle.
//
// A sequence is opened with the tokens it starts with (its prompt, or after a
// preemption everything it had), gets its new tokens placed into a step by
// append() (which finds them cache room), and is closed to give its memory
// back. The generator never computes a cache address itself: SlotCache (one
// contiguous slot per sequence) and PagedCache (infer/paged_cache.h: block
// tables over a pool of fixed-size blocks, with prefix caching) implement the
// same calls.
#pragma once
#include <span>
#include <vector>

#include "model/kv_cache.h"
#include "model/transformer.h"

namespace nk {

// Host buffers of one forward_cached call under construction.
struct StepBuffer {
  std::vector<int32_t> tokens, seqs, positions;  // one entry per new token; seqs: handles
  std::vector<int32_t> logit_rows;               // indexes into tokens
  void clear();
};

class SequenceCache {
 public:
  static constexpr int32_t kNoRoom = -1;
  struct Opened {
    int32_t handle = kNoRoom;
    // Leading tokens of the opened ids whose keys and values the cache holds
    // already (a shared prefix), always fewer than all of them.
    int64_t cached = 0;
  };
  virtual ~SequenceCache() = default;

  // Most positions one sequence can hold (its prompt and generated tokens
  // but the last, which is never fed back).
  virtual int64_t max_len() const = 0;
  // Most new tokens one step may carry (decode tokens plus prompt chunks).
  virtual int64_t max_tokens() const = 0;
  // A handle for a new sequence of at most `len` positions that starts with
  // `ids` (room for all of them is taken now), or kNoRoom while the cache
  // cannot take it (closing sequences makes room; a len over max_len() never
  // fits).
  virtual Opened open(int64_t len, std::span<const int32_t> ids) = 0;
  // Gives an open sequence's memory back; the handle is invalid afterwards.
  virtual void close(int32_t seq) = 0;
  // Appends `ids`, the tokens at positions [first, first + ids.size()) of an
  // open sequence, to step. False, changing nothing, when the cache has no
  // room for them now (the caller frees some, say by preempting a sequence).
  virtual bool append(int32_t seq, int64_t first, std::span<const int32_t> ids,
                      StepBuffer& step) = 0;
  // Runs model over step's tokens: stores their keys and values and writes
  // the logits f32 [R, V] of its R logit rows.
  virtual void forward(Transformer& model, const StepBuffer& step, Tensor logits) = 0;
  // Occupancy, for metrics: blocks held by open sequences, and in all (a
  // SlotCache's slot is one block).
  virtual int64_t blocks_used() const = 0;
  virtual int64_t blocks_total() const = 0;
  // The memory behind it (its dtypes and bytes, for logs and tests).
  virtual const KVCache& kv() const = 0;
};

// The contiguous cache: each sequence owns one slot of a KVCache, positions
// 0..max_len-1 of it. Free slots are handed out lowest first and a closed
// slot is the next one reused. It has no prefix cache and never runs out of
// room once a sequence is open.
class SlotCache final : public SequenceCache {
 public:
  // slots: sequences held at once; max_len, max_tokens, device, kv, tp, etp: as in KVCache.
  SlotCache(const ModelConfig& cfg, DType compute, int64_t slots, int64_t max_len,
            int64_t max_tokens, Device device = kHost, KvDType kv = std::nullopt, int64_t tp = 1,
            int64_t etp = 0);

  int64_t slots() const { return cache_.blocks(); }
  int64_t free_slots() const { return int64_t(free_.size()); }
  const KVCache& kv() const override { return cache_; }

  int64_t max_len() const override { return cache_.max_len(); }
  int64_t max_tokens() const override { return cache_.max_tokens(); }
  Opened open(int64_t len, std::span<const int32_t> ids) override;
  void close(int32_t seq) override;
  bool append(int32_t seq, int64_t first, std::span<const int32_t> ids, StepBuffer& step) override;
  void forward(Transformer& model, const StepBuffer& step, Tensor logits) override;
  int64_t blocks_used() const override { return slots() - free_slots(); }
  int64_t blocks_total() const override { return slots(); }

 private:
  void check_open(int32_t seq, const char* what) const;

  KVCache cache_;
  std::vector<int32_t> free_;   // a stack: the next slot handed out is free_.back()
  std::vector<uint8_t> open_;   // per slot
  std::vector<int32_t> table_;  // [slots, 1]: slot s is block s
};

}  // namespace nk
