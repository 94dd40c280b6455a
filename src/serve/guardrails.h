// Guardrails in front of the served model, as NeMo Guardrails puts input
// and output rails around an LLM: input rails (guardrails_input.h) look at
// the user's text before the model runs, output rails (guardrails_output.h)
// at the answer before the client sees it. Configured in a file of their own
// (serve.guardrails.config, guardrails_config.h).
//
// A triggered input rail answers the configured refusal as the assistant's
// message with finish_reason "content_filter" (as OpenAI marks filtered
// content) without running the model, or with on_input: error a 400 whose
// code is "content_filter". A refusing output rail ends that choice with the
// refusal and finish_reason "content_filter"; its sequence is cancelled.
// Every rail that runs counts in nekton_guardrail_checks_total{rail} and
// every one that triggers in nekton_guardrail_triggered_total{rail}.
//
// The jailbreak heuristics need the served model's perplexity. The model and
// its kernels belong to the engine thread (CPU kernels keep static scratch),
// so the score is an Engine job (Engine::run_job) that the engine thread
// runs between two decode steps while the HTTP thread waits for it: it costs
// the batch one prompt-sized forward, and no second copy of the model.
//
// Logprobs with output rails are refused (400 naming `logprobs`): the
// tokens' strings would show what the rails redact.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "serve/guardrails_config.h"
#include "serve/guardrails_input.h"
#include "serve/guardrails_output.h"
#include "serve/openai_request.h"

namespace nk {

class Engine;
struct ServeContext;

class Guardrails {
 public:
  // nk::Error naming the file, line and key of anything that cannot be used
  // (a pattern that does not compile, a missing classifier or label).
  explicit Guardrails(GuardrailsConfig c);

  const GuardrailsConfig& config() const { return cfg_; }
  const InputRails& input() const { return input_; }
  const OutputRails& output() const { return output_; }
  const std::string& refusal() const { return cfg_.refusal; }
  bool input_error() const { return cfg_.on_input == "error"; }  // else answer the refusal

  // The user's text the input rails check: chat messages as input.messages
  // picks (the last user message, every user message, or all), each prompt
  // of a completion (ids decoded).
  std::vector<std::string> input_texts(const CompletionRequest& r, const Tokenizer& tok) const;
  // The input rails over a request, perplexity through ctx.engine; counted
  // in ctx.metrics.
  InputVerdict check_input(const ServeContext& ctx, const CompletionRequest& r) const;
  // Counts one finished choice that went through `f`.
  void count_output(const OutputFilter& f, ServeMetrics& m) const;

  // "input rails: ...; output rails: ..." for the startup log.
  std::string describe() const;

 private:
  GuardrailsConfig cfg_;
  InputRails input_;
  OutputRails output_;
};

// The rails of `path` (serve.guardrails.config); null for "".
std::unique_ptr<Guardrails> load_guardrails(const std::string& path);

// The perplexity of a text's tokens (`tok`) under the engine's model,
// computed on the engine thread (the rails' PerplexityFn).
PerplexityFn engine_perplexity(Engine& engine, const Tokenizer& tok);

}  // namespace nk
