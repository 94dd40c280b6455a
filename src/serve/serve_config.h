// The keys of `nekton serve` (serve.*), with their defaults and one-line docs.
#pragma once
#include <cstdint>
#include <string>

#include "core/config_bind.h"
#include "infer/model_source.h"
#include "model/kv_cache.h"

namespace nk {

struct ServeConfig {
  std::string model, adapter, tokenizer, dtype = "f32", quantize;
  std::string host = "127.0.0.1";
  int64_t port = 8000;
  std::string model_name;  // "" = the model folder's name
  std::string chat_template = "auto";
  int64_t max_batch = 16;       // sequences decoded together
  int64_t prefill_chunk = 256;  // prompt tokens one step may carry
  int64_t max_model_len = 0;    // positions per sequence; 0 = model.max_seq_len
  int64_t max_body_mb = 8;
  int64_t max_connections = 1024;  // HTTP connections open at once
  int64_t header_timeout_s = 10, body_timeout_s = 60, idle_timeout_s = 30, write_timeout_s = 30;
  int64_t default_max_tokens = 0;       // 0 = up to the context
  int64_t block_size = 16;              // paged KV cache: positions per block
  int64_t kv_memory_mb = 0;             // 0 = enough for max_batch full-length sequences
  std::string kv_cache_dtype = "auto";  // model/kv_cache.h parse_kv_cache_dtype
  std::string guardrails;               // rails file (serve/guardrails_config.h); "" = none
  int64_t tp = 1;                       // tensor-parallel ranks (serve/engine_mirror.h)
  double timeout_s = 600;               // under tp: a rank's wait for the others

  void bind(ConfigBinder& b) {
    b.bind("serve.model", model,
           "saved model folder (config.json + model.safetensors) or a GGUF file (.gguf; its "
           "tokenizer and chat template come with it)");
    b.bind("serve.adapter", adapter,
           "a LoRA or IA3 adapter folder in Hugging Face PEFT's format to apply, unmerged");
    b.bind("serve.tokenizer", tokenizer,
           "tokenizer spec (default: the one saved with the model, else bytes)");
    b.bind("serve.dtype", dtype, "compute precision: f32 or bf16");
    b.bind("serve.quantize", quantize, kQuantizeKeyDoc);
    b.bind("serve.host", host, "address to listen on (0.0.0.0: every interface)");
    b.bind("serve.port", port, "TCP port (0: pick a free one; the startup line names it)");
    b.bind("serve.model_name", model_name,
           "the model id clients name in \"model\" (default: the model folder's name)");
    b.bind("serve.chat_template", chat_template,
           "chat template for /v1/chat/completions: auto (the model's own Jinja template, from "
           "its tokenizer_config.json), a FILE.jinja, or a built-in name (chatml, llama3, ...)");
    b.bind("serve.max_batch", max_batch, "sequences decoded together (in-flight batching)");
    b.bind("serve.prefill_chunk", prefill_chunk,
           "prompt tokens one decode step may carry (bounds a step's workspace)");
    b.bind("serve.max_model_len", max_model_len,
           "positions per sequence, prompt and completion together (0: the model's max_seq_len)");
    b.bind("serve.max_body_mb", max_body_mb, "largest request body in MiB (larger: 413)");
    b.bind("serve.max_connections", max_connections,
           "HTTP connections open at once (idle, being read or answered); one more is answered "
           "503 and closed");
    b.bind("serve.header_timeout_s", header_timeout_s,
           "seconds a request's line and headers may take from its first byte (slower: 408 and "
           "the connection closes)");
    b.bind("serve.body_timeout_s", body_timeout_s,
           "seconds a request's body may take after its head (slower: 408 and the connection "
           "closes)");
    b.bind("serve.idle_timeout_s", idle_timeout_s,
           "seconds a kept-alive connection may wait for its next request before it closes");
    b.bind("serve.write_timeout_s", write_timeout_s,
           "seconds each write of a response may take: a client that stops reading loses its "
           "connection (and its stream's sequences are cancelled)");
    b.bind("serve.default_max_tokens", default_max_tokens,
           "max_tokens of a request that gives none (0: up to the context, as vLLM)");
    b.bind("serve.block_size", block_size, "paged KV cache block size in positions");
    b.bind("serve.kv_memory_mb", kv_memory_mb,
           "paged KV cache memory in MiB, all layers' keys and values (0: enough for max_batch "
           "full-length sequences); a sequence takes blocks as it grows, and when they run out "
           "the newest is preempted and recomputed later");
    b.bind("serve.kv_cache_dtype", kv_cache_dtype, kKvCacheDtypeDoc);
    b.bind("serve.guardrails.config", guardrails,
           "guardrails file (YAML, see configs/guardrails.yaml): input rails (length, blocked "
           "topics, a fastText classifier, jailbreak heuristics) and output rails (PII "
           "redaction, blocked words) in front of the model; \"\": none");
    b.bind("serve.tp", tp,
           "tensor-parallel ranks the model is split over (vLLM's --tensor-parallel-size): "
           "launch that many processes (nekton serve --nproc N, or mpirun -np N); rank 0 serves "
           "HTTP, every rank holds its share of the heads, KV cache, MLP units, experts and "
           "vocabulary (and of serve.adapter's; quantised as they load with serve.quantize) and "
           "runs each decode step; a model folder on the CPU, without the "
           "guardrails' jailbreak perplexity checks or the prompt's log-probabilities (echo)");
    b.bind("serve.timeout_s", timeout_s,
           "under serve.tp > 1: seconds a rank waits for the others at any exchange before the "
           "job stops with an error");
  }
};

}  // namespace nk
