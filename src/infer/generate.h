// Batched autoregressive generation over a KV cache.
//
// Requests are admitted into free cache room in order (continuous batching:
// a finished or cancelled sequence's room takes the next waiting prompt).
// Each step is one Transformer::forward_cached call carrying one token per
// decoding sequence plus prompt chunks of newly admitted ones, all ragged: no
// padding, and a step's cost does not grow with the prompt lengths beyond
// attention over the cached prefixes.
//
// Each request has its own Sampler (seeded from its SamplingConfig), so its
// tokens do not depend on which other requests share its steps. With a
// tokenizer, only its ids are sampled, reported in logprobs or accepted in
// prompts: a model's rows past them are vocabulary padding (Sampler).
#pragma once
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer/tokenizer.h"
#include "infer/sampler.h"
#include "infer/sequence_cache.h"
#include "model/transformer.h"

namespace nk {

// (serve/engine_mirror.cc sends every field of a request, its sampling's
// too, to the other ranks of a tensor-parallel server: a field added here
// is added there.)
struct GenerationRequest {
  std::vector<int32_t> prompt;  // at least one id
  int64_t max_new_tokens = 64;
  // Generation stops once the decoded continuation contains one of these;
  // the returned text ends just before it. Needs a tokenizer.
  std::vector<std::string> stop;
  bool stop_at_eos = true;  // stop at the tokenizer's eod id (not appended)
  SamplingConfig sampling;
  // Report each sampled token's log-probability, and with top_logprobs > 0
  // (at most kMaxTopLogprobs, needs logprobs) that many most likely tokens.
  // Off, they cost nothing.
  bool logprobs = false;
  int64_t top_logprobs = 0;
};

// Context: the sequence filled its cache room (max_len positions).
enum class FinishReason { Length, Stop, Eos, Context, Cancelled };
// "length", "stop", "eos", "context", "cancelled"
const char* finish_reason_name(FinishReason r);

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids (the eod id excluded)
  std::string text;             // their bytes, cut before a stop string ("" without tokenizer)
  FinishReason finish = FinishReason::Length;
  // One entry per entry of tokens when the request asked for logprobs, else
  // empty; top_logprobs[i] holds the request's top_logprobs most likely
  // tokens at tokens[i]'s step (see TokenEvent::top).
  std::vector<float> logprobs;
  std::vector<std::vector<TokenLogprob>> top_logprobs;
};

// Called once per sampled token (eod included) with the request's index and
// the piece of text that became final with it: bytes that cannot yet be part
// of a stop string and end on a whole UTF-8 character. Pieces concatenate to
// GenerationResult::text; the last call of a request flushes what was held.
using TokenCallback = std::function<void(int64_t seq, int32_t token, std::string_view piece)>;
// Sees each request's next-token logits (V floats: every row of the model,
// padding included) before sampling; for tests.
using LogitsCallback = std::function<void(int64_t seq, const float* logits, int64_t V)>;

// How far text may be streamed when bytes [0, from) are out already: its end,
// less a tail that a later token could complete into a stop string (a suffix
// that is a proper prefix of one) or the bytes of an unfinished UTF-8
// character. Never less than `from`.
size_t streamable_end(const std::string& text, size_t from, const std::vector<std::string>& stop);

// One event of step(): a sequence sampled `token` (the eod id included).
struct TokenEvent {
  int64_t id = 0;          // as submit() returned it
  int32_t token = 0;       //
  std::string_view piece;  // text that became final with it (see TokenCallback); valid
                           // until the next step(), cancel() or release()
  bool finished = false;   // the sequence ended with it (result(id).finish says why)
  // With the request's logprobs: log-probability of `token` (see
  // TokenLogprob), and its top_logprobs most likely tokens, most likely first,
  // ties by lower id; valid until the next step().
  float logprob = 0;
  std::span<const TokenLogprob> top;
};

// Step-wise generation (in-flight batching). submit() queues a request and
// returns its id; each step() admits waiting requests (first come, first
// served) while the batch and the cache have room, then runs one
// forward_cached call: one token for every decoding sequence and prompt
// chunks of newly admitted ones, and samples one token for each sequence
// whose context is complete. cancel() ends a sequence between steps and frees
// its cache memory at once. A sequence's tokens depend only on its request:
// not on when it was submitted or on what else shares its steps.
//
// Cache memory is reached only through a SequenceCache (infer/sequence_cache.h).
class Generator {
 public:
  // tok may be null (then no stop strings or eod; texts stay empty, and every
  // id of the model may be sampled). nk::Error when tok has more ids than
  // the model has rows.
  // batch_size: sequences decoded together. prefill_chunk: prompt tokens one
  // step may carry (bounds the workspace). max_len: cache positions per
  // sequence; 0 sizes the cache (a SlotCache) for the requests at hand
  // whenever the generator is idle, up to the model's max_seq_len (a waiting
  // request longer than the cache then waits until the running ones end).
  // kv_dtype: the cache's keys and values (nullopt: the compute dtype).
  Generator(Transformer& model, const Tokenizer* tok, int64_t batch_size,
            int64_t prefill_chunk = 256, int64_t max_len = 0, KvDType kv_dtype = std::nullopt);
  // Over a given cache (a paged one, or a SlotCache of fixed size); at most
  // batch_size sequences run at once.
  Generator(Transformer& model, const Tokenizer* tok, std::unique_ptr<SequenceCache> cache,
            int64_t batch_size);
  ~Generator();

  // Queues a request; returns its id (0, 1, ... in submission order). A
  // request with max_new_tokens = 0 is finished at once. nk::Error naming
  // "prompt ID" for an empty prompt, an id outside the vocabulary, a prompt
  // that leaves no room in the cache (max_len, or model.max_seq_len), a
  // negative max_new_tokens, a bad sampling option or stop string, or
  // top_logprobs outside [0, kMaxTopLogprobs] or given without logprobs.
  int64_t submit(GenerationRequest request);
  // One decode step over every active sequence, admitting waiting ones
  // first. Returns one event per sampled token. on_logits sees each sampled
  // sequence's logits (by id) before sampling. Does nothing without work.
  std::span<const TokenEvent> step(const LogitsCallback& on_logits = {});
  // Ids that end a sequence as the tokenizer's eod does (not appended;
  // finish Eos; not with stop_at_eos off): a chat model's other
  // end-of-turn tokens, e.g. generation_config.json's eos_token_id list
  // (Llama 3.1's <|eom_id|> beside <|eot_id|>). Set before submitting.
  void set_end_ids(std::vector<int32_t> ids) { end_ids_ = std::move(ids); }
  // Ends a waiting or running sequence (finish Cancelled; its result keeps
  // the tokens and text generated so far). False, changing nothing, for an
  // unknown, released or finished id.
  bool cancel(int64_t id);

  bool finished(int64_t id) const;  // nk::Error for an unknown id
  // The tokens and text so far; final once finished(id). nk::Error for an
  // unknown id.
  const GenerationResult& result(int64_t id) const;
  // Takes a finished sequence's result and forgets the id.
  GenerationResult release(int64_t id);

  int64_t waiting() const { return int64_t(waiting_.size()); }
  // Sequences sent back to wait because the cache ran out of room (their
  // work is recomputed when they return).
  int64_t preemptions() const { return preemptions_; }
  // Prompt tokens (and, after a preemption, generated ones) whose keys and
  // values came from the cache's prefix cache instead of being computed.
  int64_t prefix_hit_tokens() const { return prefix_hits_; }
  // The cache in use (null before the first step when the generator sizes it).
  const SequenceCache* cache() const { return cache_.get(); }
  int64_t running() const { return int64_t(active_.size()); }
  bool idle() const { return waiting_.empty() && active_.empty(); }

  // Submits requests, steps until they are finished and releases them.
  // Results in request order; the callbacks name a request by its index.
  // Every request is checked before any is submitted (errors name
  // "prompt INDEX").
  std::vector<GenerationResult> run(const std::vector<GenerationRequest>& requests,
                                    const TokenCallback& on_token = {},
                                    const LogitsCallback& on_logits = {});

 private:
  struct Sequence;
  void check(const GenerationRequest& r, const std::string& name) const;
  Sequence& find(int64_t id, const char* what) const;
  void fit_cache();
  void admit();
  void preempt(Sequence& s);
  bool accept(Sequence& s, int32_t token, float logprob, std::span<const TokenLogprob> top);
  void finish(Sequence& s, FinishReason why);

  Transformer& model_;
  const Tokenizer* tok_;
  int64_t vocab_;                 // ids sampled: the tokenizer's, or the model's without one
  std::vector<int32_t> end_ids_;  // besides the eod
  int64_t batch_, chunk_;
  bool auto_size_;                        // the cache is ours to size (max_len = 0)
  KvDType kv_dtype_;                      // of the caches we size
  std::unique_ptr<SequenceCache> cache_;  // null until a step needs it (auto size)
  int64_t next_id_ = 0, preemptions_ = 0, prefix_hits_ = 0;
  std::map<int64_t, std::unique_ptr<Sequence>> seqs_;  // submitted, not released
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> active_;  // in admission order
  StepBuffer buf_;
  std::vector<Sequence*> row_seq_;  // the sequence of each logit row
  Tensor logits_;                   // f32 [batch, V]
  std::vector<float> host_;
  std::vector<TokenEvent> events_;
  std::vector<TokenLogprob> top_;  // every event's top list this step
};

}  // namespace nk
