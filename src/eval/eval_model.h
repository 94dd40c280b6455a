// What a benchmark asks of a language model, in lm-evaluation-harness's three
// request kinds, and the implementation over a loaded Nekton model.
//
// Tokenisation is the harness's HFLM's: a (context, continuation) pair moves
// the context's trailing white space onto the continuation, encodes context +
// continuation whole and takes the continuation's tokens as those past the
// context's own encoding; an empty context is the prefix token (the
// tokenizer's BOS, else its end of text). Inputs longer than the model's
// context keep their last max_seq_len + 1 tokens. Rolling log-likelihoods
// score every token of the text after the prefix token in the harness's
// disjoint windows of max_seq_len predictions.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer/tokenizer.h"
#include "model/transformer.h"

namespace nk {

struct LoglikelihoodRequest {
  std::string context, continuation;
};
struct LoglikelihoodResult {
  double logprob = 0;   // sum over the continuation's tokens, nats
  bool greedy = false;  // every continuation token is its position's argmax
};
struct GenerateRequest {
  std::string context;
  std::vector<std::string> until;  // the text ends before the first of these
  int64_t max_gen_toks = 256;
  int64_t repeats = 1;  // answers asked for
  // Sampled (generation_kwargs' do_sample): answer j draws with seed + j;
  // else greedy, the one answer given `repeats` times.
  bool sample = false;
  double temperature = 0, top_p = 1;
  int64_t top_k = 0;  // 0: off
  uint64_t seed = 0;
};

class EvalModel {
 public:
  virtual ~EvalModel() = default;
  virtual std::vector<LoglikelihoodResult> loglikelihood(
      const std::vector<LoglikelihoodRequest>& reqs) = 0;
  virtual std::vector<double> loglikelihood_rolling(const std::vector<std::string>& texts) = 0;
  // The continuations, request by request, `repeats` of each in order.
  virtual std::vector<std::string> generate_until(const std::vector<GenerateRequest>& reqs) = 0;
};

// Requests are sorted longest first and scored batch_size at a time (fewer
// when a batch's logits would pass 1 GiB) by one forward of right-padded
// rows: a causal model's logits at a row's real positions do not see its
// padding. With shared prefixes (the default) requests are instead grouped
// by context (a question's choices) and scored over the paged KV cache
// (infer/paged_cache.h): each group's context is computed once, its full
// blocks found by the prefix cache for every choice, which computes only
// its tail and continuation. Generation runs through the batched Generator
// (infer/generate.h).
class LocalEvalModel : public EvalModel {
 public:
  // specials: contexts and continuations may hold special-token text (a
  // chat template's), encoded as those tokens, as Hugging Face tokenizers do.
  LocalEvalModel(Transformer& model, const Tokenizer& tok, int64_t batch_size,
                 std::vector<int32_t> end_ids = {}, bool specials = false);
  std::vector<LoglikelihoodResult> loglikelihood(
      const std::vector<LoglikelihoodRequest>& reqs) override;
  std::vector<double> loglikelihood_rolling(const std::vector<std::string>& texts) override;
  std::vector<std::string> generate_until(const std::vector<GenerateRequest>& reqs) override;
  // eval.share_prefixes: false scores every request's whole row.
  void set_share_prefixes(bool on) { share_prefixes_ = on; }
  // Context tokens the last loglikelihood calls took from the prefix cache
  // instead of computing them.
  int64_t shared_prefix_tokens() const { return shared_tokens_; }

  // The last input_len - cont.size() + 1 .. input_len positions of `input`
  // predict `cont`.
  struct TokenRequest {
    std::vector<int32_t> input, cont;
  };
  std::vector<LoglikelihoodResult> score(const std::vector<TokenRequest>& reqs);
  // score() over the paged KV cache, each context computed once.
  std::vector<LoglikelihoodResult> score_shared(const std::vector<TokenRequest>& reqs);
  // (context, continuation) token ids as the harness encodes the pair.
  std::pair<std::vector<int32_t>, std::vector<int32_t>> encode_pair(const std::string& context,
                                                                    const std::string& cont) const;
  int32_t prefix_token() const;

 private:
  std::vector<int32_t> encode(const std::string& text) const;
  Transformer& model_;
  const Tokenizer& tok_;
  int64_t batch_, max_len_, vocab_;
  std::vector<int32_t> end_ids_;
  bool specials_;
  bool share_prefixes_ = true;
  int64_t shared_tokens_ = 0;
};

}  // namespace nk
