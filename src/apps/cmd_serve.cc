// `nekton serve`: an OpenAI-compatible HTTP server over a saved model
// (src/serve). Loads the model, its tokenizer, an optional adapter and the
// chat template, starts the engine thread and serves until SIGINT/SIGTERM.
#include <fmt/format.h>
#include <signal.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include "apps/commands.h"
#include "apps/tensor_parallel_ranks.h"
#include "ckpt/model_io.h"
#include "core/config_bind.h"
#include "core/error.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/stop_signal.h"
#include "data/chat/chat_config.h"
#include "dist/mpi/runtime.h"
#include "serve/engine_mirror.h"
#include "serve/guardrails.h"
#include "serve/serve_cache.h"
#include "serve/serve_config.h"
#include "serve/server.h"

namespace nk {

namespace {

// A stop signal ends the process within kShutdownLimit: requests in flight
// may run on for kShutdownGrace, then they are cut off (503 for those not
// streaming, an error event for streams) and get kCutOffWait to write that;
// then every connection closes, whether its client reads or not.
constexpr auto kShutdownLimit = std::chrono::seconds(10);
constexpr auto kShutdownGrace = std::chrono::milliseconds(8500);
constexpr auto kCutOffWait = std::chrono::milliseconds(400);

void check_keys(const ServeConfig& k) {
  if (k.model.empty()) fail("serve.model: no model folder given (serve.model=DIR or --model DIR)");
  auto in = [](const char* key, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi) fail("{}: must be in [{}, {}], got {}", key, lo, hi, v);
  };
  in("serve.port", k.port, 0, 65535);
  in("serve.max_batch", k.max_batch, 1, 4096);
  in("serve.prefill_chunk", k.prefill_chunk, 1, limits::kSeqLen);
  in("serve.max_model_len", k.max_model_len, 0, limits::kSeqLen);
  in("serve.max_body_mb", k.max_body_mb, 1, 1 << 20);
  in("serve.max_connections", k.max_connections, 1, 1 << 20);
  in("serve.header_timeout_s", k.header_timeout_s, 1, 3600);
  in("serve.body_timeout_s", k.body_timeout_s, 1, 3600);
  in("serve.idle_timeout_s", k.idle_timeout_s, 1, 3600);
  in("serve.write_timeout_s", k.write_timeout_s, 1, 3600);
  in("serve.default_max_tokens", k.default_max_tokens, 0, limits::kSeqLen);
  in("serve.block_size", k.block_size, 1, 1 << 16);
  in("serve.kv_memory_mb", k.kv_memory_mb, 0, int64_t(1) << 40);
  parse_kv_cache_dtype(k.kv_cache_dtype, "serve.kv_cache_dtype");
}

// The chat template, or null with the reason the chat route will give: the
// one serve.chat_template names, or the model's own (a GGUF's
// tokenizer.chat_template; a folder's tokenizer_config.json, at the top or
// under tokenizer/ as `nekton import hf` writes it).
std::shared_ptr<const ChatTemplate> pick_chat_template(const ServeConfig& k, const RunnableModel& m,
                                                       std::string& why) {
  if (k.chat_template != "auto") {
    try {
      return chat_template_for(k.chat_template, m.gguf ? "" : k.model);
    } catch (const Error& e) {
      throw e.with_context("serve.chat_template");
    }
  }
  try {
    if (m.gguf) {
      if (m.gguf_chat_template.empty()) fail("GGUF '{}' has no tokenizer.chat_template", k.model);
      return chat_template_from_jinja(m.gguf_chat_template, k.model + " tokenizer.chat_template");
    }
    return chat_template_for("auto", k.model);
  } catch (const Error& e) {
    why = fmt::format(
        "This server has no chat template ({}). Start it with serve.chat_template=NAME, NAME "
        "a .jinja file or one of: {}",
        e.what(), fmt::join(chat_template_names(), ", "));
    NK_WARN("nekton serve: no chat template, /v1/chat/completions will answer 400: {}", e.what());
    return nullptr;
  }
}

// `--model DIR` is serve.model=DIR; everything else as other commands take it.
CommandArgs serve_args(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--model") {
      if (i + 1 >= args.size()) fail("--model needs a model folder");
      out.push_back("serve.model=" + args[++i]);
    } else if (args[i].rfind("--model=", 0) == 0) {
      out.push_back("serve.model=" + args[i].substr(8));
    } else {
      out.push_back(args[i]);
    }
  }
  return parse_command_args(out);
}

// The serve.* keys of the model (what load_runnable_model reads).
ModelSourceKeys source_keys(const CommandArgs& a, const ServeConfig& k) {
  return {.prefix = "serve",
          .model = k.model,
          .tokenizer = k.tokenizer,
          .dtype = k.dtype,
          .quantize = k.quantize,
          .adapter = k.adapter,
          .allow_nonfinite = a.allow_nonfinite};
}

// The command's arguments again for mpirun, without --nproc.
std::vector<std::string> without_nproc(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--nproc") {
      ++i;
      continue;
    }
    if (args[i].rfind("--nproc=", 0) == 0) continue;
    out.push_back(args[i]);
  }
  return out;
}

// The server on this process's model, or rank 0's share of it (its engine
// mirrored to the other ranks).
int serve_on(const CommandArgs& a, const ServeConfig& k, const Guardrails* rails,
             const nn::TensorParallel& tp, EngineMirror* mirror) {
  RunnableModel loaded = load_runnable_model(source_keys(a, k), tp);
  std::unique_ptr<Tokenizer> tok = std::move(loaded.tokenizer);
  std::unique_ptr<Transformer> model = std::move(loaded.model);
  const int64_t max_len = serve_max_len(k, *model);
  std::string no_template;
  const std::shared_ptr<const ChatTemplate> tmpl = pick_chat_template(k, loaded, no_template);

  ServeMetrics metrics;
  std::unique_ptr<SequenceCache> cache = make_serve_cache(k, *model);
  const std::string cache_line = cache->kv().describe();
  Engine engine(*model, *tok, std::move(cache), k.max_batch, metrics, loaded.end_ids, mirror);
  ServeContext ctx{*model,      *tok,
                   tmpl.get(),  chat_specials(*tok, loaded.gguf ? "" : k.model),
                   no_template, k.model_name.empty() ? loaded.name : k.model_name,
                   max_len,     k.default_max_tokens,
                   engine,      metrics};
  ctx.guardrails = rails;
  if (!loaded.gguf) ctx.steerlm = read_steerlm_spec(k.model);

  // A client that goes away mid-write must not end the process.
  ::signal(SIGPIPE, SIG_IGN);
  HttpLimits limits;
  limits.max_body = k.max_body_mb << 20;
  limits.max_connections = k.max_connections;
  limits.header_timeout = std::chrono::seconds(k.header_timeout_s);
  limits.body_timeout = std::chrono::seconds(k.body_timeout_s);
  limits.idle_timeout = std::chrono::seconds(k.idle_timeout_s);
  limits.write_timeout = std::chrono::seconds(k.write_timeout_s);
  OpenAIServer server(ctx, limits);
  const int port = server.bind(k.host, int(k.port));
  // Before the startup line: a server that cannot serve says so and exits.
  server.start();
  if (rails)
    fmt::print(stderr, "nekton serve: guardrails {}: {}\n", k.guardrails, rails->describe());
  fmt::print(stderr, "nekton serve: {}\n", cache_line);
  fmt::print(stderr,
             "nekton serve: listening on http://{}:{} (model {}, max_model_len {}, max_batch {}, "
             "chat template {})\n",
             k.host, port, ctx.model_name, max_len, k.max_batch, tmpl ? tmpl->name() : "none");

  StopSignalScope signals;
  std::mutex mu;
  std::condition_variable cv;
  bool served = false;
  std::thread watcher([&] {
    std::unique_lock lock(mu);
    while (!served && !stop_signal()) cv.wait_for(lock, std::chrono::milliseconds(100));
    if (served) return;
    // Graceful: new requests get 503 while those in flight finish, for at
    // most kShutdownGrace; then the rest are cut off (a 503, or an error
    // event ending a stream).
    fmt::print(stderr, "nekton serve: signal {}: finishing {} requests in flight\n", stop_signal(),
               server.in_flight());
    server.drain();
    const auto deadline = std::chrono::steady_clock::now() + kShutdownGrace;
    while (server.in_flight() > 0 && std::chrono::steady_clock::now() < deadline)
      cv.wait_for(lock, std::chrono::milliseconds(20));
    if (server.in_flight() > 0) {
      fmt::print(stderr, "nekton serve: cutting off {} requests\n", server.in_flight());
      engine.stop();
      // Their answers end at once, but for clients that do not read: those
      // connections close with the rest.
      const auto cut = std::chrono::steady_clock::now() + kCutOffWait;
      while (server.in_flight() > 0 && std::chrono::steady_clock::now() < cut)
        cv.wait_for(lock, std::chrono::milliseconds(20));
    }
    server.stop();
  });
  server.listen();
  {
    std::lock_guard lock(mu);
    served = true;
  }
  cv.notify_all();
  watcher.join();
  engine.stop();
  fmt::print(stderr, "nekton serve: stopped\n");
  return 0;
}

// A rank other than 0 under serve.tp: its share of the model and a
// Generator over a cache of its heads, stepping as rank 0's engine does.
// Stop signals end the job through rank 0 (which finishes its requests,
// then sends the end), so they are only noted here.
void follow_on(const CommandArgs& a, const ServeConfig& k, const nn::TensorParallel& tp,
               dist::Communicator& group) {
  StopSignalScope signals;
  RunnableModel loaded = load_runnable_model(source_keys(a, k), tp);
  Generator gen(*loaded.model, loaded.tokenizer.get(), make_serve_cache(k, *loaded.model),
                k.max_batch);
  gen.set_end_ids(loaded.end_ids);
  follow_engine(gen, group);
}

}  // namespace

int cmd_serve(const CommandArgs& raw) {
  const CommandArgs a = serve_args(raw.args);
  ConfigSchema schema = schema_of([](ConfigBinder& b) { ServeConfig().bind(b); });
  if (a.help) {
    fmt::print(
        "usage: nekton serve serve.model=DIR [--config configs/serve.yaml] [key=value ...]\n"
        "       nekton serve --model DIR [key=value ...]\n"
        "       nekton serve --nproc N --model DIR serve.tp=N [key=value ...]\n\n"
        "An OpenAI-compatible HTTP server: POST /v1/chat/completions and /v1/completions\n"
        "(streaming with server-sent events or not), GET /v1/models, /health and /metrics\n"
        "(Prometheus), POST /tokenize and /detokenize. SIGINT or SIGTERM stops it after the\n"
        "requests in flight (at most {} s). With serve.tp=N the model is split over N\n"
        "processes by tensor parallelism (--nproc N starts them on this host; or mpirun -np N),\n"
        "rank 0 serving.\n\n{}",
        kShutdownLimit.count(), schema.help());
    return 0;
  }
  Config c = Config::load(schema, a.config_path, a.overrides);
  ServeConfig k;
  ConfigReader reader(c);
  k.bind(reader);
  check_keys(k);
  // Before the model: a bad guardrails file fails at once.
  const std::unique_ptr<Guardrails> rails = load_guardrails(k.guardrails);

  if (k.tp > 1 && rails &&
      (rails->config().input.length_per_perplexity ||
       rails->config().input.prefix_suffix_perplexity))
    fail(
        "serve.tp = {}: not supported yet with the jailbreak perplexity checks of "
        "serve.guardrails.config '{}' (they run the model apart from the decode steps every rank "
        "follows)",
        k.tp, k.guardrails);
  check_tensor_parallel_source(source_keys(a, k), k.tp);  // before any process starts
  if (!launch_tensor_parallel("serve", "serve.tp", k.tp, a.nproc, without_nproc(raw.args)))
    return serve_on(a, k, rails.get(), {}, nullptr);
  // Under mpirun: rank 0 serves, the others follow its engine; any rank's
  // error ends the whole job ("nekton rank R: ...").
  dist::MpiRuntime mpi;
  try {
    TensorParallelRanks ranks(mpi, "serve.tp", k.tp, k.timeout_s);
    if (k.tp == 1) {  // one process under mpirun or srun: nobody to follow it
      serve_on(a, k, rails.get(), {}, nullptr);
    } else if (ranks.lead()) {
      EngineMirror mirror(ranks.group(), [&mpi](const std::string& why) { mpi.abort(why); });
      serve_on(a, k, rails.get(), ranks.tp(), &mirror);
    } else {
      follow_on(a, k, ranks.tp(), ranks.group());
    }
  } catch (const std::exception& e) {
    mpi.abort(e.what());
  }
  return 0;
}

}  // namespace nk
