// What the routes of `nekton serve` share: the model, its tokenizer and chat
// template, the engine, the metrics and the guardrails. Read-only after
// start-up but for the engine and the metrics, which are thread-safe.
#pragma once
#include <optional>

#include <cstdint>
#include <string>
#include "align/steerlm.h"

#include "data/chat/chat_template.h"
#include "data/tokenizer/tokenizer.h"
#include "model/transformer.h"
#include "serve/engine.h"
#include "serve/serve_metrics.h"

namespace nk {

class Guardrails;

struct ServeContext {
  const Transformer& model;
  const Tokenizer& tok;
  const ChatTemplate* chat_template;  // null: chat requests get a 400 saying why
  ChatSpecials specials;              // the tokenizer's bos and eos strings for the template
  std::string no_template;            // why chat_template is null
  std::string model_name;             // the id clients name
  int64_t max_len = 0;                // positions per sequence (prompt + completion)
  int64_t default_max_tokens = 0;     // 0: up to the context
  Engine& engine;
  ServeMetrics& metrics;
  const Guardrails* guardrails = nullptr;  // null: none (serve/guardrails.h)
  // The model folder's steerlm.json (align/steerlm.h), for requests with
  // steerlm_attributes; without one they name the attributes themselves.
  std::optional<SteerLmSpec> steerlm = std::nullopt;
};

// Token counts of one request, for its log line.
struct RequestTally {
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

}  // namespace nk
