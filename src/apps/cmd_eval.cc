// `nekton eval perplexity`: sliding-window perplexity of a saved model on a
// text file or an indexed dataset (infer/perplexity.h).
#include <fmt/format.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "ckpt/model_io.h"
#include "core/atomic_file.h"
#include "core/config_bind.h"
#include "core/log.h"
#include "data/dataset/indexed_dataset.h"
#include "data/dataset/text_dataset.h"
#include "data/tokenizer/tokenizer.h"
#include "infer/perplexity.h"

namespace nk {

namespace {

struct EvalKeys {
  std::string model, text, data_prefix, tokenizer, dtype = "f32", output;
  PerplexityOptions ppl;
  int64_t max_tokens = 0;

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
    b.bind("eval.output", output, "also write the result as JSON to this file");
  }
};

std::vector<int32_t> load_tokens(const EvalKeys& k) {
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
  std::unique_ptr<Tokenizer> tok = load_model_tokenizer(k.tokenizer, k.model, "eval.tokenizer");
  std::string bytes;
  try {
    bytes = read_text_file(k.text);
  } catch (const Error& e) {
    throw e.with_context("eval.text");
  }
  tok->encode(bytes, ids);
  if (k.max_tokens > 0 && int64_t(ids.size()) > k.max_tokens) ids.resize(size_t(k.max_tokens));
  return ids;
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
  EvalKeys k;
  Config c = Config::load(schema, a.config_path, a.overrides);
  ConfigReader reader(c);
  k.bind(reader);
  const std::string& dir = k.model;
  if (dir.empty()) fail("eval.model: no model folder given (eval.model=DIR)");
  if (k.max_tokens < 0) fail("eval.max_tokens: must be >= 0, got {}", k.max_tokens);
  const PerplexityOptions& opt = k.ppl;
  if (opt.window < 0) fail("eval.window: must be >= 0, got {}", opt.window);
  std::vector<int32_t> ids = load_tokens(k);
  if (ids.size() < 2) {
    const char* key = k.max_tokens > 0 && k.max_tokens < 2 ? "eval.max_tokens"
                      : k.text.empty()                     ? "eval.data_prefix"
                                                           : "eval.text";
    fail("{}: {} token(s) to score; perplexity needs at least 2", key, ids.size());
  }
  auto model = load_model(dir, parse_dtype(k.dtype), a.allow_nonfinite);
  auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  PerplexityResult r = evaluate_perplexity(*model, ids, opt, [&](int64_t done, int64_t total) {
    auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - last).count() < 5 && done < total) return;
    last = now;
    double s = std::chrono::duration<double>(now - t0).count();
    NK_INFO("eval: window {}/{} ({:.0f} s, ETA {:.0f} s)", done, total, s,
            s / double(done) * double(total - done));
  });
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

}  // namespace

int cmd_eval(const CommandArgs& a) {
  const std::vector<std::string>& args = a.args;
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    fmt::print(
        "usage: nekton eval perplexity [--config FILE.yaml] [key=value ...] [--help]\n\n"
        "  perplexity   sliding-window perplexity on a text file or an indexed dataset\n");
    return args.empty() ? 1 : 0;
  }
  if (args[0] != "perplexity") fail("eval: unknown evaluation '{}' (known: perplexity)", args[0]);
  CommandArgs sub = parse_command_args(std::vector<std::string>(args.begin() + 1, args.end()));
  if (sub.nproc > 0) fail("--nproc is an option of nekton train only");
  return eval_perplexity(sub);
}

}  // namespace nk
