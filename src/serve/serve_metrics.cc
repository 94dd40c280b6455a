#include "serve/serve_metrics.h"

namespace nk {

ServeMetrics::ServeMetrics()
    : requests(registry.add<Counter>("nekton_requests_total",
                                     "HTTP requests answered, by endpoint and status code",
                                     std::vector<std::string>{"endpoint", "status"})),
      prompt_tokens(registry.add<Counter>("nekton_prompt_tokens_total",
                                          "Prompt tokens of the sequences submitted")),
      generation_tokens(registry.add<Counter>("nekton_generation_tokens_total",
                                              "Tokens sampled (end-of-sequence tokens included)")),
      disconnects(registry.add<Counter>(
          "nekton_requests_cancelled_total",
          "Requests whose sequences were cancelled because the client disconnected")),
      preemptions(registry.add<Counter>(
          "nekton_num_preemptions_total",
          "Sequences preempted when the KV cache ran out of blocks (recomputed later)")),
      prefix_hit_tokens(registry.add<Counter>(
          "nekton_prefix_cache_hit_tokens_total",
          "Prompt tokens whose keys and values came from the prefix cache, not computed")),
      time_to_first_token(registry.add<Histogram>(
          "nekton_time_to_first_token_seconds",
          "Seconds from a request's arrival to the first token of each of its sequences",
          std::vector<double>{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                              2.5, 5.0, 7.5, 10.0, 20.0, 40.0})),
      inter_token_latency(registry.add<Histogram>(
          "nekton_inter_token_latency_seconds", "Seconds between consecutive tokens of a sequence",
          std::vector<double>{0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                              0.75, 1.0, 2.5})),
      request_latency(registry.add<Histogram>(
          "nekton_e2e_request_latency_seconds",
          "Seconds from a generation request's arrival to its last token",
          std::vector<double>{0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                              30.0, 40.0, 50.0, 60.0, 120.0})),
      running(registry.add<Gauge>("nekton_num_requests_running", "Sequences being decoded")),
      waiting(registry.add<Gauge>(
          "nekton_num_requests_waiting",
          "Sequences submitted to the generator and waiting for batch or KV cache room")),
      queue_depth(registry.add<Gauge>(
          "nekton_queue_depth",
          "Sequences accepted and not yet decoding: the engine's inbox plus the waiting ones")),
      kv_blocks_used(registry.add<Gauge>(
          "nekton_kv_blocks_used",
          "Paged KV cache blocks held by running sequences (serve.block_size positions "
          "each)")),
      kv_blocks_total(registry.add<Gauge>("nekton_kv_blocks_total",
                                          "Paged KV cache blocks in all (serve.kv_memory_mb)")),
      guardrail_checks(registry.add<Counter>(
          "nekton_guardrail_checks_total",
          "Guardrail checks by rail: requests an input rail looked at, choices an output rail "
          "looked at",
          std::vector<std::string>{"rail"})),
      guardrail_triggered(registry.add<Counter>(
          "nekton_guardrail_triggered_total",
          "Guardrail checks that triggered, by rail: requests refused, choices redacted or "
          "refused",
          std::vector<std::string>{"rail"})) {}

}  // namespace nk
