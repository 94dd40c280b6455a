// `nekton eval perplexity`: sliding-window perplexity of a saved model on a
// text file or an indexed dataset; `nekton eval logprobs`: the same tokens'
// log-probabilities one by one, with the top-K alternatives
// (infer/perplexity.h).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "apps/token_json.h"
#include "ckpt/model_io.h"
#include "ckpt/model_vocab.h"
#include "core/atomic_file.h"
#include "core/config_bind.h"
#include "core/log.h"
#include "core/progress.h"
#include "data/dataset/indexed_dataset.h"
#include "data/dataset/text_dataset.h"
#include "data/tokenizer/tokenizer.h"
#include "infer/model_source.h"
#include "infer/perplexity.h"
#include "infer/sampler.h"

namespace nk {

namespace {

struct EvalKeys {
  std::string model, text, data_prefix, tokenizer, dtype = "f32", output, format = "text";
  PerplexityOptions ppl;
  int64_t max_tokens = 0, top_k = 0;
  Device device = kHost;

  void bind(ConfigBinder& b) {
    b.bind("eval.model", model, "saved model folder (config.json + model.safetensors)");
    b.bind("eval.text", text, "text file to score (plain, .gz or .dz)");
    b.bind("eval.data_prefix", data_prefix,
           "indexed dataset PREFIX(.bin/.idx) to score, documents concatenated");
    b.bind("eval.tokenizer", tokenizer,
           "tokenizer for eval.text (default: the one saved with the model, else bytes)");
    b.bind("eval.window", ppl.window, "tokens per window, <= model.max_seq_len (0 = max_seq_len)");
    b.bind("eval.stride", ppl.stride,
           "tokens between window starts, in [1, window] (-1 = window: disjoint chunks)");
    b.bind("eval.max_tokens", max_tokens, "score only the first N tokens (0 = all)");
    b.bind("eval.dtype", dtype, "compute precision: f32 or bf16");
    b.bind_with<std::string>(
        "eval.device", device_name(device),
        "where the model runs: cpu, or cuda (a build with the CUDA backend on a machine with a "
        "GPU)",
        [&](const std::string& s) { device = parse_device(s, "eval.device"); });
    b.bind("eval.output", output,
           "also write the result as JSON to this file (logprobs: the JSONL lines)");
    b.bind("eval.top_k", top_k,
           "logprobs: the K most likely tokens at each position too (at most 20)");
    b.bind("eval.format", format, "logprobs: text (a line per token) or jsonl");
  }
};

std::vector<int32_t> load_tokens(const EvalKeys& k, const Tokenizer& tok) {
  if (k.text.empty() == k.data_prefix.empty())
    fail("eval.text: give exactly one of eval.text=FILE and eval.data_prefix=PREFIX");
  std::vector<int32_t> ids;
  if (!k.data_prefix.empty()) {
    std::shared_ptr<const IndexedDataset> ds;
    try {
      ds = IndexedDataset::open(k.data_prefix);
    } catch (const Error& e) {
      throw e.with_context("eval.data_prefix");
    }
    int64_t total = ds->num_tokens();
    if (k.max_tokens > 0) total = std::min(total, k.max_tokens);
    ids.resize(size_t(total));
    int64_t at = 0;
    for (int64_t s = 0; s < ds->num_sequences() && at < total; ++s) {
      const int64_t n = std::min<int64_t>(ds->lengths()[size_t(s)], total - at);
      ds->read(s, 0, n, ids.data() + at);
      at += n;
    }
    return ids;
  }
  std::string bytes;
  try {
    bytes = read_text_file(k.text);
  } catch (const Error& e) {
    throw e.with_context("eval.text");
  }
  tok.encode(bytes, ids);
  if (k.max_tokens > 0 && int64_t(ids.size()) > k.max_tokens) ids.resize(size_t(k.max_tokens));
  return ids;
}

// What both evaluations read: the keys, the tokens to score, the tokenizer
// and the model.
struct EvalInputs {
  EvalKeys k;
  std::vector<int32_t> ids;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Transformer> model;
};

EvalInputs eval_inputs(const CommandArgs& a, const ConfigSchema& schema) {
  EvalInputs in;
  EvalKeys& k = in.k;
  Config c = Config::load(schema, a.config_path, a.overrides);
  ConfigReader reader(c);
  k.bind(reader);
  if (k.model.empty()) fail("eval.model: no model folder given (eval.model=DIR)");
  if (k.max_tokens < 0) fail("eval.max_tokens: must be >= 0, got {}", k.max_tokens);
  if (k.ppl.window < 0) fail("eval.window: must be >= 0, got {}", k.ppl.window);
  // The settings first, before anything is read: a typo is told at once.
  if (k.format != "text" && k.format != "jsonl")
    fail("eval.format: must be text or jsonl, got '{}'", k.format);
  if (k.top_k < 0 || k.top_k > kMaxTopLogprobs)
    fail("eval.top_k: {} must be in [0, {}]", k.top_k, kMaxTopLogprobs);
  in.tok = load_model_tokenizer(k.tokenizer, k.model, "eval.tokenizer");
  in.ids = load_tokens(k, *in.tok);
  if (in.ids.size() < 2) {
    const char* key = k.max_tokens > 0 && k.max_tokens < 2 ? "eval.max_tokens"
                      : k.text.empty()                     ? "eval.data_prefix"
                                                           : "eval.text";
    fail("{}: {} token(s) to score; scoring needs at least 2", key, in.ids.size());
  }
  // Before the weights are read: a model with fewer rows than the tokenizer
  // has ids is the wrong pairing; more are padding (ckpt/model_vocab.h).
  // Token ids read from eval.data_prefix with no tokenizer named or saved
  // need none (bytes is only the default for printing them).
  const bool implicit = k.tokenizer.empty() && stored_tokenizer(k.model).empty();
  if (!k.text.empty() || !implicit) {
    try {
      check_model_vocab(read_model_config(k.model).vocab_size,
                        fmt::format("model folder '{}'", k.model), in.tok->vocab_size(),
                        tokenizer_source(k.tokenizer, k.model, "eval.tokenizer"));
    } catch (const Error& e) {
      throw e.with_context("eval.model");
    }
  }
  in.model = load_model(k.model, parse_dtype(k.dtype), a.allow_nonfinite, k.device);
  return in;
}

// Logs the windows done every 5 s.
// The windows scored, on stderr (core/progress.h): one updating bar line on
// a terminal, a plain line at most every 10 s elsewhere.
std::function<void(int64_t, int64_t)> window_progress(const std::string& label) {
  auto p = std::make_shared<Progress>(label);
  auto started = std::make_shared<bool>(false);
  return [p, started](int64_t done, int64_t total) {
    if (!*started) p->start(double(total), "windows"), *started = true;
    p->set_done(double(done));
    if (done == total) p->finish();
  };
}

int eval_perplexity(const CommandArgs& a) {
  ConfigSchema schema = schema_of([](ConfigBinder& b) { EvalKeys().bind(b); });
  if (a.help) {
    fmt::print(
        "usage: nekton eval perplexity eval.model=DIR (eval.text=FILE | eval.data_prefix=PREFIX)"
        " [key=value ...]\n\n"
        "Hugging Face's sliding-window perplexity: window k feeds eval.window tokens from\n"
        "k * eval.stride and scores only the tokens no earlier window scored.\n\n{}",
        schema.help());
    return 0;
  }
  EvalInputs in = eval_inputs(a, schema);
  const EvalKeys& k = in.k;
  const PerplexityOptions& opt = k.ppl;
  auto& model = in.model;
  auto t0 = std::chrono::steady_clock::now();
  PerplexityResult r = evaluate_perplexity(*model, in.ids, opt, window_progress("eval perplexity"));
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("tokens scored {}\nwindows {}\nmean loss {:.6f} nats/token\nperplexity {:.4f}\n",
             r.tokens_scored, r.windows, r.mean_loss, r.perplexity);
  const std::string& out = k.output;
  if (!out.empty()) {
    nlohmann::json j = {
        {"tokens_scored", r.tokens_scored},
        {"windows", r.windows},
        {"mean_loss", r.mean_loss},
        {"perplexity", r.perplexity},
        {"window", opt.window ? opt.window : model->config().max_seq_len},
        {"stride",
         opt.stride ? opt.stride : (opt.window ? opt.window : model->config().max_seq_len)},
        {"seconds", secs}};
    write_file_atomic(out, j.dump(2) + "\n");
  }
  return 0;
}

int eval_logprobs(const CommandArgs& a) {
  ConfigSchema schema = schema_of([](ConfigBinder& b) { EvalKeys().bind(b); });
  if (a.help) {
    fmt::print(
        "usage: nekton eval logprobs eval.model=DIR (eval.text=FILE | eval.data_prefix=PREFIX)"
        " [eval.top_k=K] [eval.format=text|jsonl] [key=value ...]\n\n"
        "The log-probability of every token after the first given the ones before it (the\n"
        "windows of `eval perplexity`), with the K most likely tokens at each position.\n\n{}",
        schema.help());
    return 0;
  }
  EvalInputs in = eval_inputs(a, schema);
  const EvalKeys& k = in.k;
  const Tokenizer& tok = *in.tok;
  const std::vector<ScoredToken> scores =
      token_logprobs(*in.model, in.ids, k.ppl, k.top_k, window_progress("eval logprobs"),
                     std::min(tok.vocab_size(), in.model->config().vocab_size));
  std::string jsonl;
  double sum = 0;
  for (const ScoredToken& s : scores) {
    nlohmann::ordered_json j;
    j["position"] = s.position;
    j = logprob_json(std::move(j), tok, s.id, s.logprob, s.top);
    jsonl += j.dump() + "\n";
    sum += s.logprob;
    if (k.format == "text") fmt::print("{}\n", logprob_line(s.position, j));
  }
  if (k.format == "jsonl")
    fmt::print("{}", jsonl);
  else
    fmt::print("tokens scored {}\nsum logprob {:.6f}\nmean loss {:.6f} nats/token\n", scores.size(),
               sum, -sum / double(scores.size()));
  if (!k.output.empty()) write_file_atomic(k.output, jsonl);
  return 0;
}

}  // namespace

int cmd_eval(const CommandArgs& a) {
  const std::vector<std::string>& args = a.args;
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    fmt::print(
        "usage: nekton eval perplexity|logprobs|reward|tasks [--config FILE.yaml] "
        "[key=value ...] [--help]\n\n"
        "  perplexity   sliding-window perplexity on a text file or an indexed dataset\n"
        "  logprobs     each token's log-probability (and the top-K alternatives)\n"
        "  reward       a reward model's scores and accuracy on preference pairs\n"
        "  tasks        benchmark tasks in lm-evaluation-harness's YAML form\n");
    return args.empty() ? 1 : 0;
  }
  if (args[0] != "perplexity" && args[0] != "logprobs" && args[0] != "reward" && args[0] != "tasks")
    fail("eval: unknown evaluation '{}' (known: perplexity, logprobs, reward, tasks)", args[0]);
  CommandArgs sub = parse_command_args(std::vector<std::string>(args.begin() + 1, args.end()));
  if (sub.nproc > 0)
    fail("--nproc is an option of nekton train, finetune, align, generate and serve only");
  if (args[0] == "reward") return eval_reward(sub);
  if (args[0] == "tasks") return eval_tasks(sub);
  return args[0] == "perplexity" ? eval_perplexity(sub) : eval_logprobs(sub);
}

}  // namespace nk
