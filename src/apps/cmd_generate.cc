#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>

#include "align/steerlm.h"
#include "apps/commands.h"
#include "apps/tensor_parallel_ranks.h"
#include "apps/token_json.h"
#include "ckpt/model_io.h"
#include "core/config_bind.h"
#include "core/limits.h"
#include "core/log.h"
#include "data/tokenizer/tokenizer.h"
#include "infer/generate.h"

namespace nk {

namespace {

struct GenerateKeys {
  std::string model, adapter, tokenizer, prompt = "\n", prompt_file, stop, dtype = "f32", quantize;
  std::string format = "text", kv_cache_dtype = "auto";
  std::string steerlm_attributes, steerlm_template;
  int64_t batch_size = 8, max_tokens = 200, logprobs = -1, tp = 1;
  double timeout_s = 600;
  SamplingConfig sampling{.temperature = 0.8, .top_k = 40, .top_p = 0.95};
  bool ignore_eos = false;
  Device device = kHost;

  void bind(ConfigBinder& b) {
    b.bind("generate.model", model,
           "saved model folder (config.json + model.safetensors) or a GGUF file (.gguf)");
    b.bind("generate.adapter", adapter,
           "a LoRA or IA3 adapter folder in Hugging Face PEFT's format (adapter_config.json + "
           "adapter_model.safetensors) to apply, unmerged, to generate.model");
    b.bind("generate.tokenizer", tokenizer,
           "tokenizer spec (default: the one saved with the model, else bytes)");
    b.bind("generate.prompt", prompt,
           "text to continue; repeat the key (or give a JSON list) for several prompts");
    b.bind("generate.prompt_file", prompt_file,
           "prompts, one per line, or JSONL with a \"prompt\" or \"text\" field");
    b.bind("generate.batch_size", batch_size, "sequences decoded together");
    b.bind("generate.max_tokens", max_tokens, "most tokens to generate per prompt");
    b.bind("generate.temperature", sampling.temperature, "softmax temperature (0 = greedy)");
    b.bind("generate.top_k", sampling.top_k, "sample among the k most likely tokens (0 = all)");
    b.bind("generate.top_p", sampling.top_p, "nucleus sampling mass (1 = off)");
    b.bind("generate.min_p", sampling.min_p,
           "drop tokens below min_p x the top token's probability (0 = off)");
    b.bind("generate.repetition_penalty", sampling.repetition_penalty,
           "divide positive / multiply negative logits of seen tokens (1 = off)");
    // As an int64 key: a negative seed wraps, as it always has.
    b.bind_with<int64_t>("generate.seed", int64_t(sampling.seed),
                         "sampling seed (prompt i uses seed + i)",
                         [&](int64_t v) { sampling.seed = uint64_t(v); });
    b.bind("generate.stop", stop, "stop string; repeat the key (or give a JSON list) for several");
    b.bind("generate.ignore_eos", ignore_eos, "keep going past the end-of-document token");
    b.bind("generate.dtype", dtype, "compute precision: f32 or bf16");
    b.bind_with<std::string>(
        "generate.device", device_name(device),
        "where the model and its KV cache live: cpu, or cuda (a dense model folder, in a build "
        "with "
        "the CUDA backend on a machine with a GPU)",
        [&](const std::string& s) { device = parse_device(s, "generate.device"); });
    b.bind("generate.quantize", quantize, kQuantizeKeyDoc);
    b.bind("generate.kv_cache_dtype", kv_cache_dtype, kKvCacheDtypeDoc);
    b.bind("generate.logprobs", logprobs,
           "print each generated token's id, text and log-probability, with this many most "
           "likely alternatives (0: none; -1: off)");
    b.bind("generate.steerlm_attributes", steerlm_attributes,
           "SteerLM: condition every prompt on these attribute values, \"helpfulness:4,"
           "verbosity:1,...\" (the model's steerlm.json, written by align.method=steerlm, "
           "names the attributes and their range; every one needs a value)");
    b.bind("generate.steerlm_template", steerlm_template,
           "SteerLM: how the values are written before the prompt (\"\" = the model's "
           "steerlm.json template, else {attributes})");
    b.bind("generate.format", format,
           "text, or jsonl: one JSON line per generated token (with generate.logprobs)");
    b.bind("generate.tp", tp,
           "tensor-parallel ranks the model is split over (vLLM's --tensor-parallel-size): "
           "launch that many processes (nekton generate --nproc N, or mpirun -np N), each "
           "holding its share of the heads, MLP units, experts and vocabulary (and of "
           "generate.adapter's; quantised as they load with generate.quantize); a model "
           "folder on the CPU");
    b.bind("generate.timeout_s", timeout_s,
           "under generate.tp > 1: seconds a rank waits for the others at any exchange before "
           "the job stops with an error");
  }
};

// Each generated token's id, text and log-probability (the model's raw
// distribution), with the top alternatives: a table per prompt, or a JSON
// line per token.
void print_logprobs(const std::vector<GenerationResult>& res, const Tokenizer& tok, bool jsonl) {
  for (size_t i = 0; i < res.size(); ++i) {
    const GenerationResult& r = res[i];
    if (!jsonl) fmt::print("=== logprobs, prompt {} ===\n", i);
    for (size_t s = 0; s < r.tokens.size(); ++s) {
      nlohmann::ordered_json j;
      j["prompt"] = i;
      j["step"] = s;
      j = logprob_json(std::move(j), tok, r.tokens[s], r.logprobs[s], r.top_logprobs[s]);
      fmt::print("{}\n", jsonl ? j.dump() : logprob_line(int64_t(s), j));
    }
  }
}

// A repeatable key's values: `key=[...]` (a JSON list of strings) gives its
// items, anything else is one value.
void add_values(const std::string& key, const std::string& v, std::vector<std::string>& out) {
  if (!v.empty() && v.front() == '[') {
    nlohmann::json j = nlohmann::json::parse(v, nullptr, false);
    if (j.is_array()) {
      for (auto& x : j) {
        if (!x.is_string()) fail("{}: the JSON list must hold strings, got {}", key, x.dump());
        out.push_back(x.get<std::string>());
      }
      return;
    }
  }
  out.push_back(v);
}

// Pulls every `key=value` of a repeatable key out of the overrides.
std::vector<std::string> take_repeated(std::vector<std::string>& overrides,
                                       const std::string& key) {
  std::vector<std::string> values, rest;
  for (const std::string& o : overrides) {
    if (o.rfind(key + "=", 0) == 0)
      add_values(key, o.substr(key.size() + 1), values);
    else
      rest.push_back(o);
  }
  overrides = rest;
  return values;
}

std::vector<std::string> read_prompt_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("generate.prompt_file: cannot open '{}'", path);
  std::vector<std::string> prompts;
  std::string line;
  bool jsonl = path.ends_with(".jsonl") || path.ends_with(".json");
  for (int64_t n = 1; std::getline(f, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (prompts.empty() && line.front() == '{') jsonl = true;
    if (!jsonl) {
      prompts.push_back(line);
      continue;
    }
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      fail("generate.prompt_file: {}:{}: not a JSON object", path, n);
    const char* field = j.contains("prompt") ? "prompt" : "text";
    if (!j.contains(field) || !j[field].is_string())
      fail("generate.prompt_file: {}:{}: no string \"prompt\" or \"text\" field", path, n);
    prompts.push_back(j[field].get<std::string>());
  }
  if (prompts.empty()) fail("generate.prompt_file: '{}' holds no prompts", path);
  return prompts;
}

std::vector<int32_t> encode_prompt(const Tokenizer& tok, const std::string& prompt, size_t i,
                                   int64_t vocab) {
  std::vector<int32_t> ids = tok.encode(prompt);
  if (ids.empty()) fail("generate.prompt: prompt {} encodes to no tokens", i);
  for (int32_t id : ids)
    if (id >= vocab)
      fail("generate.tokenizer: token {} of prompt {} is outside the model's vocabulary ({})", id,
           i, vocab);
  return ids;
}

// Pieces end on whole UTF-8 characters (the engine holds split ones).
void write_pieces(std::span<const TokenEvent> events) {
  for (const TokenEvent& e : events) std::fwrite(e.piece.data(), 1, e.piece.size(), stdout);
  if (!events.empty()) std::fflush(stdout);
}

ModelSourceKeys source_keys(const CommandArgs& a, const GenerateKeys& k) {
  return {.prefix = "generate",
          .model = k.model,
          .tokenizer = k.tokenizer,
          .dtype = k.dtype,
          .quantize = k.quantize,
          .adapter = k.adapter,
          .allow_nonfinite = a.allow_nonfinite,
          .device = k.device};
}

// The generation itself, on this process's model or its tensor-parallel
// share (every rank of the group decodes the same tokens; `lead` prints).
int generate_on(const CommandArgs& a, const GenerateKeys& k,
                const std::vector<std::string>& prompts, const std::vector<std::string>& stops,
                const nn::TensorParallel& tp, bool lead) {
  const SamplingConfig& sc = k.sampling;
  const int64_t max_tokens = k.max_tokens, batch = k.batch_size;
  const bool jsonl = k.format == "jsonl";
  const KvDType kv_dtype = parse_kv_cache_dtype(k.kv_cache_dtype, "generate.kv_cache_dtype");
  RunnableModel loaded = load_runnable_model(source_keys(a, k), tp);
  std::unique_ptr<Tokenizer> tok = std::move(loaded.tokenizer);
  std::unique_ptr<Transformer> model = std::move(loaded.model);
  check_kv_cache_dtype(model->config(), kv_dtype, model->device(), "generate.kv_cache_dtype");
  std::vector<GenerationRequest> reqs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    reqs[i].prompt = encode_prompt(*tok, prompts[i], i, model->config().vocab_size);
    reqs[i].max_new_tokens = max_tokens;
    reqs[i].stop = stops;
    reqs[i].stop_at_eos = !k.ignore_eos;
    reqs[i].sampling = sc;
    reqs[i].sampling.seed = sc.seed + i;
    reqs[i].logprobs = k.logprobs >= 0;
    reqs[i].top_logprobs = std::max<int64_t>(k.logprobs, 0);
  }
  Generator gen(*model, tok.get(), std::min<int64_t>(batch, int64_t(reqs.size())),
                /*prefill_chunk=*/256, /*max_len=*/0, kv_dtype);
  gen.set_end_ids(loaded.end_ids);  // generation_config.json's other end-of-turn ids
  std::vector<int64_t> ids;         // prompt i is id i
  for (GenerationRequest& r : reqs) ids.push_back(gen.submit(std::move(r)));
  const bool stream = lead && ids.size() == 1 && !jsonl;
  if (stream) {
    fmt::print("{}", prompts[0]);
    std::fflush(stdout);
  }
  auto t0 = std::chrono::steady_clock::now();
  // The first token's time splits prefill from decoding (one prompt: the
  // rest are decode steps alone).
  std::optional<std::chrono::steady_clock::time_point> t_first;
  int64_t n_first = 0;
  while (!gen.idle()) {
    std::span<const TokenEvent> events = gen.step();
    if (!t_first && !events.empty()) {
      t_first = std::chrono::steady_clock::now();
      n_first = int64_t(events.size());
    }
    if (stream) write_pieces(events);
  }
  std::vector<GenerationResult> res;
  for (int64_t id : ids) res.push_back(gen.release(id));
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t n_tok = 0;
  for (auto& r : res) n_tok += int64_t(r.tokens.size());
  if (!lead) return 0;
  if (stream) {
    fmt::print("\n");
  } else if (!jsonl) {
    for (size_t i = 0; i < res.size(); ++i)
      fmt::print("=== prompt {} ({} tokens, {}) ===\n{}{}\n", i, res[i].tokens.size(),
                 finish_reason_name(res[i].finish), prompts[i], res[i].text);
  }
  if (k.logprobs >= 0) print_logprobs(res, *tok, jsonl);
  std::fflush(stdout);
  const auto t_end = std::chrono::steady_clock::now();
  const double first = t_first ? std::chrono::duration<double>(*t_first - t0).count() : secs;
  const double decode = std::chrono::duration<double>(t_end - t_first.value_or(t_end)).count();
  // One closing line (scripts cut the output at its last "\n["): speed, then the cache.
  fmt::print(stderr,
             "[{} prompts, {} tokens in {:.2f} s: {:.1f} tokens/s; first token after {:.2f} s, "
             "then {:.1f} tokens/s{}{}]\n",
             res.size(), n_tok, secs, secs > 0 ? double(n_tok) / secs : 0.0, first,
             decode > 0 ? double(n_tok - n_first) / decode : 0.0, gen.cache() ? "; " : "",
             gen.cache() ? gen.cache()->kv().describe() : std::string());
  return 0;
}

}  // namespace

void print_sample(Transformer& model, const Tokenizer& tok, const std::string& prompt,
                  int64_t max_tokens, const SamplingConfig& sc) {
  GenerationRequest r;
  r.prompt = encode_prompt(tok, prompt, 0, model.config().vocab_size);
  r.max_new_tokens = max_tokens;
  r.sampling = sc;
  fmt::print("{}", prompt);
  std::fflush(stdout);
  Generator gen(model, &tok, 1);
  gen.submit(std::move(r));
  while (!gen.idle()) write_pieces(gen.step());
  fmt::print("\n");
}

int cmd_generate(const CommandArgs& a) {
  ConfigSchema schema = schema_of([](ConfigBinder& b) { GenerateKeys().bind(b); });
  if (a.help) {
    fmt::print(
        "usage: nekton generate generate.model=DIR [generate.prompt=TEXT ...] [key=value ...]\n"
        "       nekton generate --nproc N generate.tp=N generate.model=DIR ...\n\n"
        "One prompt streams its continuation; several (repeated generate.prompt, a JSON list,\n"
        "or generate.prompt_file) are decoded generate.batch_size at a time and printed as\n"
        "one block per prompt. With generate.tp=N the model is split over N processes by\n"
        "tensor parallelism (--nproc N starts them on this host; or mpirun -np N).\n\n{}",
        schema.help());
    return 0;
  }
  std::vector<std::string> overrides = a.overrides;
  std::vector<std::string> prompts = take_repeated(overrides, "generate.prompt");
  std::vector<std::string> stops = take_repeated(overrides, "generate.stop");
  Config c = Config::load(schema, a.config_path, overrides);
  GenerateKeys k;
  ConfigReader reader(c);
  k.bind(reader);
  const std::string& dir = k.model;
  if (dir.empty()) fail("generate.model: no model given (generate.model=DIR or FILE.gguf)");
  const SamplingConfig& sc = k.sampling;
  try {
    validate(sc);
  } catch (const Error& e) {
    throw Error(std::string("generate.") + e.what());
  }
  const int64_t max_tokens = k.max_tokens, batch = k.batch_size;
  if (max_tokens < 0) fail("generate.max_tokens: must be >= 0, got {}", max_tokens);
  if (batch < 1) fail("generate.batch_size: must be >= 1, got {}", batch);
  if (k.logprobs < -1 || k.logprobs > kMaxTopLogprobs)
    fail("generate.logprobs: must be in [-1, {}], got {}", kMaxTopLogprobs, k.logprobs);
  if (k.format != "text" && k.format != "jsonl")
    fail("generate.format: must be text or jsonl, got '{}'", k.format);
  if (k.format == "jsonl" && k.logprobs < 0)
    fail(
        "generate.format: jsonl lists the tokens with their log-probabilities; set "
        "generate.logprobs too");
  parse_kv_cache_dtype(k.kv_cache_dtype, "generate.kv_cache_dtype");  // refused here, not later
  check_limit("", "generate.max_tokens", max_tokens, limits::kSeqLen, "positions");
  check_limit("", "generate.batch_size", batch, limits::kBatch, "sequences");
  if (stops.empty() && !k.stop.empty()) add_values("generate.stop", k.stop, stops);
  for (const std::string& s : stops)
    if (s.empty()) fail("generate.stop: empty stop string");
  if (!k.prompt_file.empty()) {
    if (!prompts.empty())
      fail("generate.prompt_file: give prompts in a file or with generate.prompt, not both");
    prompts = read_prompt_file(k.prompt_file);
  }
  if (prompts.empty()) add_values("generate.prompt", k.prompt, prompts);
  for (size_t i = 0; i < prompts.size(); ++i)
    if (prompts[i].empty()) fail("generate.prompt: prompt {} is empty", i);
  if (!k.steerlm_attributes.empty()) {  // as align.method=steerlm wrote its training prompts
    const SteerLmSpec spec = steerlm_spec_for(dir, k.steerlm_attributes, k.steerlm_template,
                                              "generate.steerlm_attributes");
    for (std::string& p : prompts)
      p = steerlm_condition(spec, k.steerlm_attributes, p, "generate.steerlm_attributes")
              .get<std::string>();
  } else if (!k.steerlm_template.empty()) {
    fail("generate.steerlm_template: given without generate.steerlm_attributes");
  }
  check_tensor_parallel_source(source_keys(a, k), k.tp);  // before any process starts
  std::vector<std::string> args;
  if (!a.config_path.empty()) args.insert(args.end(), {"--config", a.config_path});
  if (a.allow_nonfinite) args.push_back("--allow-nonfinite");
  args.insert(args.end(), a.overrides.begin(), a.overrides.end());
  if (!launch_tensor_parallel("generate", "generate.tp", k.tp, a.nproc, args))
    return generate_on(a, k, prompts, stops, {}, true);
  // Under mpirun: rank 0 prints, and any rank's error ends the whole job
  // ("nekton rank R: ...").
  dist::MpiRuntime mpi;
  try {
    TensorParallelRanks ranks(mpi, "generate.tp", k.tp, k.timeout_s);
    generate_on(a, k, prompts, stops, ranks.tp(), ranks.lead());
  } catch (const std::exception& e) {
    mpi.abort(e.what());
  }
  return 0;
}

}  // namespace nk
