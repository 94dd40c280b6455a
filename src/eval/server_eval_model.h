// EvalModel over a running OpenAI-compatible server's /v1/completions
// (Nekton's `nekton serve`, vLLM, ...): the server tokenizes, the client
// sends text.
//
//   loglikelihood: the prompt context + continuation (the context's trailing
//     white space moved onto the continuation, as the local path encodes the
//     pair) with echo, logprobs 1 and max_tokens 0; the continuation's
//     tokens are those from the one holding the context's end byte on (by
//     text_offset, in bytes), their token_logprobs summed; greedy when each
//     is its top_logprobs' most likely.
//   loglikelihood_rolling: the whole text scored so (it must fit the
//     server's context: no windows).
//   generate_until: completions with temperature 0, `stop` the non-empty
//     until strings (at most the server's limit, 4 for OpenAI's) and
//     max_tokens max_gen_toks; the text is cut at the first until string.
//     A sampled request (do_sample) asks its `repeats` answers as n
//     choices of one request with its temperature, top_p, top_k (an
//     extension vLLM and Nekton take) and seed.
// An empty context is `prefix_text` (the text of the model's end-of-text or
// BOS token, which the server encodes as that token); without one such a
// request is an error naming eval.prefix_text.
//
// Requests go batch_size prompts per request (`prompt` a list). A refused
// connection, a timeout, a status other than 200 or a body that is not the
// answer expected is an nk::Error naming the URL.
#pragma once
#include <chrono>
#include <string>

#include "core/http_client.h"
#include "eval/eval_model.h"

namespace nk {

class ServerEvalModel : public EvalModel {
 public:
  // url: http://HOST:PORT[/v1] (a trailing /v1 is added when missing).
  ServerEvalModel(const std::string& url, int64_t batch_size, std::chrono::milliseconds timeout,
                  std::string prefix_text = "", std::string model_name = "");
  std::vector<LoglikelihoodResult> loglikelihood(
      const std::vector<LoglikelihoodRequest>& reqs) override;
  std::vector<double> loglikelihood_rolling(const std::vector<std::string>& texts) override;
  std::vector<std::string> generate_until(const std::vector<GenerateRequest>& reqs) override;

  const std::string& endpoint() const { return endpoint_; }

 private:
  // POSTs one request, checks status and body; the choices by prompt index.
  std::vector<nlohmann::json> complete(nlohmann::json body, size_t prompts);
  // Scores prompt = context + continuation: the sum over the continuation's
  // tokens (from the one holding byte `context_bytes`).
  std::vector<LoglikelihoodResult> score(const std::vector<std::pair<std::string, size_t>>& reqs);
  const std::string& context_or_prefix(const std::string& context) const;

  std::string endpoint_;  // .../v1/completions
  HttpUrl url_;
  int64_t batch_;
  std::chrono::milliseconds timeout_;
  std::string prefix_text_, model_name_;
};

}  // namespace nk
