#include "serve/serve_cache.h"

#include "core/error.h"
#include "infer/paged_cache.h"

namespace nk {

int64_t serve_max_len(const ServeConfig& cfg, const Transformer& model) {
  const int64_t model_len = model.config().max_seq_len;
  if (cfg.max_model_len < 0) fail("serve.max_model_len: must be >= 0, got {}", cfg.max_model_len);
  if (cfg.max_model_len > model_len)
    fail("serve.max_model_len: {} is over the model's max_seq_len ({})", cfg.max_model_len,
         model_len);
  return cfg.max_model_len ? cfg.max_model_len : model_len;
}

std::unique_ptr<SequenceCache> make_serve_cache(const ServeConfig& cfg, const Transformer& model) {
  const int64_t len = serve_max_len(cfg, model);
  if (cfg.block_size < 1 || cfg.block_size > len)
    fail("serve.block_size: must be in [1, {}] (the positions of a sequence), got {}", len,
         cfg.block_size);
  if (cfg.kv_memory_mb < 0) fail("serve.kv_memory_mb: must be >= 0, got {}", cfg.kv_memory_mb);
  PagedCacheOptions o;
  o.kv_dtype = parse_kv_cache_dtype(cfg.kv_cache_dtype, "serve.kv_cache_dtype");
  check_kv_cache_dtype(model.config(), o.kv_dtype, model.device(), "serve.kv_cache_dtype");
  o.block_size = cfg.block_size;
  o.max_len = len;
  o.max_seqs = cfg.max_batch;
  o.max_tokens = cfg.max_batch + cfg.prefill_chunk;
  o.tp = model.tensor_parallel().size();  // a tensor-parallel rank's heads
  o.etp = model.tensor_parallel().expert_size();
  o.blocks = cfg.kv_memory_mb ? PagedCache::blocks_for_memory(
                                    model.config(), o.kv_dtype.value_or(model.compute_dtype()),
                                    cfg.block_size, double(cfg.kv_memory_mb), o.tp)
                              : cfg.max_batch * ((len + cfg.block_size - 1) / cfg.block_size);
  return std::make_unique<PagedCache>(model.config(), model.compute_dtype(), o, model.device());
}

}  // namespace nk
