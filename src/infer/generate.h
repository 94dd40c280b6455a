// Batched autoregressive generation over a KV cache.
//
// A Generator holds a KVCache with `batch_size` slots. Requests are admitted
// into free slots in order (continuous batching: a finished sequence's slot
// takes the next waiting prompt). Each step is one Transformer::forward_cached
// call carrying one token per decoding sequence plus prompt chunks of newly
// admitted ones, all ragged: no padding, and a step's cost does not grow with
// the prompt lengths beyond attention over the cached prefixes.
//
// Each request has its own Sampler (seeded from its SamplingConfig), so its
// tokens do not depend on which other requests share its batch.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer/tokenizer.h"
#include "infer/sampler.h"
#include "model/kv_cache.h"
#include "model/transformer.h"

namespace nk {

struct GenerationRequest {
  std::vector<int32_t> prompt;  // at least one id
  int64_t max_new_tokens = 64;
  // Generation stops once the decoded continuation contains one of these;
  // the returned text ends just before it. Needs a tokenizer.
  std::vector<std::string> stop;
  bool stop_at_eos = true;  // stop at the tokenizer's eod id (not appended)
  SamplingConfig sampling;
};

enum class FinishReason { Length, Stop, Eos, Context };
const char* finish_reason_name(FinishReason r);  // "length", "stop", "eos", "context"

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids (the eod id excluded)
  std::string text;             // their bytes, cut before a stop string ("" without tokenizer)
  FinishReason finish = FinishReason::Length;
};

// Called once per sampled token (eod included) with the request's index and
// the piece of text that became final with it: bytes that cannot yet be part
// of a stop string and end on a whole UTF-8 character. Pieces concatenate to
// GenerationResult::text; the last call of a request flushes what was held.
using TokenCallback = std::function<void(int64_t seq, int32_t token, std::string_view piece)>;
// Sees each request's next-token logits (V floats) before sampling; for tests.
using LogitsCallback = std::function<void(int64_t seq, const float* logits, int64_t V)>;

// How far text may be streamed when bytes [0, from) are out already: its end,
// less a tail that a later token could complete into a stop string (a suffix
// that is a proper prefix of one) or the bytes of an unfinished UTF-8
// character. Never less than `from`.
size_t streamable_end(const std::string& text, size_t from, const std::vector<std::string>& stop);

class Generator {
 public:
  // tok may be null (then no stop strings or eod; texts stay empty).
  // batch_size: sequences decoded together. prefill_chunk: prompt tokens one
  // step may carry (bounds the workspace).
  Generator(Transformer& model, const Tokenizer* tok, int64_t batch_size,
            int64_t prefill_chunk = 256);

  // Results in request order. nk::Error naming the request for an empty
  // prompt, an id outside the vocabulary, or a prompt that leaves no room
  // below the model's max_seq_len.
  std::vector<GenerationResult> run(const std::vector<GenerationRequest>& requests,
                                    const TokenCallback& on_token = {},
                                    const LogitsCallback& on_logits = {});

 private:
  Transformer& model_;
  const Tokenizer* tok_;
  int64_t batch_, chunk_;
  std::unique_ptr<KVCache> cache_;  // grown to the longest request seen
};

}  // namespace nk
