// Autoregressive generation by re-running the model over the (windowed)
// context; the KV-cache engine replaces this in the inference issue.
#pragma once
#include <functional>
#include <vector>

#include "infer/sampler.h"
#include "model/transformer.h"

namespace nk {

// Appends up to max_new tokens to `prompt`; on_token sees each new id and may
// return false to stop. Returns the new tokens.
std::vector<int32_t> generate(Transformer& model, const std::vector<int32_t>& prompt,
                              int64_t max_new, Sampler& sampler,
                              const std::function<bool(int32_t)>& on_token = {});

}  // namespace nk
