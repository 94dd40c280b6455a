// What `nekton serve` reports at GET /metrics (Prometheus text, metrics.h).
#pragma once
#include "serve/metrics.h"

namespace nk {

struct ServeMetrics {
  MetricsRegistry registry;
  Counter& requests;               // {endpoint, status}
  Counter& prompt_tokens;          //
  Counter& generation_tokens;      //
  Counter& disconnects;            // sequences cancelled because their client went away
  Counter& preemptions;            // sequences sent back to wait when the KV cache was full
  Counter& prefix_hit_tokens;      // prompt tokens served from the prefix cache
  Histogram& time_to_first_token;  // seconds from arrival to a request's first token
  Histogram& inter_token_latency;  // seconds between a sequence's consecutive tokens
  Histogram& request_latency;      // seconds from arrival to the last token
  Gauge& running;                  // sequences decoding
  Gauge& waiting;                  // sequences submitted, waiting for batch or cache room
  Gauge& queue_depth;              // requests not yet decoding (engine inbox + waiting)
  Gauge& kv_blocks_used;
  Gauge& kv_blocks_total;
  Counter& guardrail_checks;     // {rail}: texts or choices a guardrail looked at
  Counter& guardrail_triggered;  // {rail}: of those, the ones it refused or redacted

  ServeMetrics();
  ServeMetrics(const ServeMetrics&) = delete;
  ServeMetrics& operator=(const ServeMetrics&) = delete;
};

}  // namespace nk
