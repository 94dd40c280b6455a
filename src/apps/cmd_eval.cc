// `nekton eval perplexity`: sliding-window perplexity of a saved model on a
// text file or an indexed dataset (infer/perplexity.h).
#include <fmt/format.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "ckpt/model_io.h"
#include "core/atomic_file.h"
#include "core/log.h"
#include "data/dataset/indexed_dataset.h"
#include "data/dataset/text_dataset.h"
#include "data/tokenizer/tokenizer.h"
#include "infer/perplexity.h"

namespace nk {

namespace {

ConfigSchema eval_schema() {
  ConfigSchema s;
  s.add_string("eval.model", "", "saved model folder (config.json + model.safetensors)");
  s.add_string("eval.text", "", "text file to score (plain, .gz or .dz)");
  s.add_string("eval.data_prefix", "",
               "indexed dataset PREFIX(.bin/.idx) to score, documents concatenated");
  s.add_string("eval.tokenizer", "",
               "tokenizer for eval.text (default: the one saved with the model, else bytes)");
  s.add_int("eval.window", 0, "tokens per window, <= model.max_seq_len (0 = max_seq_len)");
  s.add_int("eval.stride", -1,
            "tokens between window starts, in [1, window] (-1 = window: disjoint chunks)");
  s.add_int("eval.max_tokens", 0, "score only the first N tokens (0 = all)");
  s.add_string("eval.dtype", "f32", "compute precision: f32 or bf16");
  s.add_string("eval.output", "", "also write the result as JSON to this file");
  return s;
}

std::vector<int32_t> load_tokens(const Config& c, const std::string& model_dir,
                                 int64_t max_tokens) {
  const std::string text = c.get_string("eval.text"), prefix = c.get_string("eval.data_prefix");
  if (text.empty() == prefix.empty())
    fail("eval.text: give exactly one of eval.text=FILE and eval.data_prefix=PREFIX");
  std::vector<int32_t> ids;
  if (!prefix.empty()) {
    std::shared_ptr<const IndexedDataset> ds;
    try {
      ds = IndexedDataset::open(prefix);
    } catch (const Error& e) {
      throw e.with_context("eval.data_prefix");
    }
    int64_t total = ds->num_tokens();
    if (max_tokens > 0) total = std::min(total, max_tokens);
    ids.resize(size_t(total));
    int64_t at = 0;
    for (int64_t s = 0; s < ds->num_sequences() && at < total; ++s) {
      const int64_t n = std::min<int64_t>(ds->lengths()[size_t(s)], total - at);
      ds->read(s, 0, n, ids.data() + at);
      at += n;
    }
    return ids;
  }
  std::string spec = c.get_string("eval.tokenizer");
  if (spec.empty()) spec = stored_tokenizer(model_dir);
  if (spec.empty()) spec = "bytes";
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = load_tokenizer(spec);
  } catch (const Error& e) {
    throw e.with_context("eval.tokenizer");
  }
  std::string bytes;
  try {
    bytes = read_text_file(text);
  } catch (const Error& e) {
    throw e.with_context("eval.text");
  }
  tok->encode(bytes, ids);
  if (max_tokens > 0 && int64_t(ids.size()) > max_tokens) ids.resize(size_t(max_tokens));
  return ids;
}

int eval_perplexity(const CommandArgs& a) {
  ConfigSchema schema = eval_schema();
  if (a.help) {
    fmt::print(
        "usage: nekton eval perplexity eval.model=DIR (eval.text=FILE | eval.data_prefix=PREFIX)"
        " [key=value ...]\n\n"
        "Hugging Face's sliding-window perplexity: window k feeds eval.window tokens from\n"
        "k * eval.stride and scores only the tokens no earlier window scored.\n\n{}",
        schema.help());
    return 0;
  }
  Config c = Config::load(schema, a.config_path, a.overrides);
  const std::string dir = c.get_string("eval.model");
  if (dir.empty()) fail("eval.model: no model folder given (eval.model=DIR)");
  const int64_t max_tokens = c.get_int("eval.max_tokens");
  if (max_tokens < 0) fail("eval.max_tokens: must be >= 0, got {}", max_tokens);
  PerplexityOptions opt;
  opt.window = c.get_int("eval.window");
  opt.stride = c.get_int("eval.stride");
  if (opt.window < 0) fail("eval.window: must be >= 0, got {}", opt.window);
  std::vector<int32_t> ids = load_tokens(c, dir, max_tokens);
  if (ids.size() < 2) {
    const char* key = max_tokens > 0 && max_tokens < 2    ? "eval.max_tokens"
                      : c.get_string("eval.text").empty() ? "eval.data_prefix"
                                                          : "eval.text";
    fail("{}: {} token(s) to score; perplexity needs at least 2", key, ids.size());
  }
  auto model = load_model(dir, parse_dtype(c.get_string("eval.dtype")));
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
  const std::string out = c.get_string("eval.output");
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
  CommandArgs sub;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& s = args[i];
    if (s == "--help" || s == "-h") {
      sub.help = true;
    } else if (s == "--config") {
      if (i + 1 >= args.size()) fail("--config needs a file name");
      sub.config_path = args[++i];
    } else if (s.rfind("--config=", 0) == 0) {
      sub.config_path = s.substr(9);
    } else if (s.find('=') == std::string::npos || s.rfind("--", 0) == 0) {
      fail("eval perplexity: argument '{}' is not a key=value setting", s);
    } else {
      sub.overrides.push_back(s);
    }
  }
  return eval_perplexity(sub);
}

}  // namespace nk
