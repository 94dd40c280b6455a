#include "infer/sequence_cache.h"

namespace nk {

void StepBuffer::clear() {
  tokens.clear();
  seqs.clear();
  positions.clear();
  logit_rows.clear();
}

SlotCache::SlotCache(const ModelConfig& cfg, DType compute, int64_t slots, int64_t max_len,
                     int64_t max_tokens, Device device, KvDType kv, int64_t tp, int64_t etp)
    : cache_(cfg, compute, slots, max_len, max_tokens, device, kv, tp, etp),
      open_(size_t(slots), 0) {
  for (int64_t s = slots - 1; s >= 0; --s) free_.push_back(int32_t(s));
  for (int64_t s = 0; s < slots; ++s) table_.push_back(int32_t(s));
}

SequenceCache::Opened SlotCache::open(int64_t len, std::span<const int32_t> ids) {
  NK_CHECK(len >= 1 && int64_t(ids.size()) <= len, "SlotCache::open: {} ids for {} positions",
           ids.size(), len);
  if (len > max_len() || free_.empty()) return {};
  const int32_t s = free_.back();
  free_.pop_back();
  open_[size_t(s)] = 1;
  return {s, 0};
}

void SlotCache::check_open(int32_t seq, const char* what) const {
  NK_CHECK(seq >= 0 && seq < int32_t(open_.size()) && open_[size_t(seq)],
           "SlotCache::{}: slot {} is not open", what, seq);
}

void SlotCache::close(int32_t seq) {
  check_open(seq, "close");
  open_[size_t(seq)] = 0;
  free_.push_back(seq);
}

bool SlotCache::append(int32_t seq, int64_t first, std::span<const int32_t> ids, StepBuffer& step) {
  check_open(seq, "append");
  const int64_t n = int64_t(ids.size());
  NK_CHECK(first >= 0 && first + n <= max_len(),
           "SlotCache::append: positions [{}, {}) outside the slot's {}", first, first + n,
           max_len());
  for (int64_t k = 0; k < n; ++k) {
    step.tokens.push_back(ids[size_t(k)]);
    step.seqs.push_back(seq);
    step.positions.push_back(int32_t(first + k));
  }
  return true;
}

void SlotCache::forward(Transformer& model, const StepBuffer& step, Tensor logits) {
  model.forward_cached(
      cache_, CachedStep{step.tokens, step.seqs, step.positions, step.logit_rows, table_}, logits);
}

}  // namespace nk
