// The KV cache `nekton serve` decodes over, built in one place from the
// serve.* keys.
#pragma once
#include <cstdint>
#include <memory>

#include "infer/sequence_cache.h"
#include "model/transformer.h"
#include "serve/serve_config.h"

namespace nk {

// Positions one sequence may hold: serve.max_model_len, or the model's
// max_seq_len when 0. nk::Error naming the key when it is over the model's.
int64_t serve_max_len(const ServeConfig& cfg, const Transformer& model);

// The paged cache (infer/paged_cache.h): blocks of serve.block_size
// positions, serve.kv_memory_mb of them (0: enough for serve.max_batch
// sequences of serve_max_len positions), prefix caching on, keys and values
// in serve.kv_cache_dtype. nk::Error naming the key for a bad block size,
// memory or dtype.
std::unique_ptr<SequenceCache> make_serve_cache(const ServeConfig& cfg, const Transformer& model);

}  // namespace nk
