#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <functional>

#include "apps/commands.h"
#include "core/config.h"
#include "core/error.h"
#include "data/preprocess.h"

namespace nk {

namespace {

ConfigSchema preprocess_schema() {
  ConfigSchema s;
  s.add_string("preprocess.input", "",
               "JSONL files, plain or zstd: comma-separated, or the key given several times");
  s.add_string("preprocess.json_key", "text", "the JSON field that holds each document's text");
  s.add_string("preprocess.tokenizer", "bytes",
               "tokenizer: bytes, gpt2, cl100k_base, ..., a BPE folder or FILE.model");
  s.add_string("preprocess.output_prefix", "",
               "writes PREFIX.bin and PREFIX.idx (Megatron format)");
  s.add_bool("preprocess.append_eod", true, "end-of-document token after each document");
  s.add_int("preprocess.workers", 0, "tokenizing threads (0 = all cores)");
  s.add_bool("preprocess.skip_bad", false,
             "skip and count bad records (bad JSON, missing key, non-string, bad UTF-8)");
  s.add_string("preprocess.invalid_utf8", "error",
               "invalid UTF-8 in a record: error (a bad record), or replace (with U+FFFD)");
  s.add_int("preprocess.block_bytes", int64_t(1) << 20,
            "bytes of lines a worker takes at once (memory grows with it x workers)");
  s.add_int("preprocess.max_line_bytes", int64_t(1) << 30, "longest line accepted");
  s.add_string("preprocess.progress", "auto",
               "auto (a bar on a terminal, else a log line every 10 s), bar, log or none");
  return s;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(start, end - start);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (!item.empty()) out.push_back(item);
    start = end + 1;
  }
  return out;
}

// `preprocess.input=a preprocess.input=b` means both files: the repeats are
// joined into one comma-separated override.
std::vector<std::string> join_repeated_inputs(const std::vector<std::string>& overrides) {
  const std::string key = "preprocess.input=";
  std::vector<std::string> out, inputs;
  for (auto& o : overrides) {
    if (o.rfind(key, 0) == 0)
      inputs.push_back(o.substr(key.size()));
    else
      out.push_back(o);
  }
  if (!inputs.empty()) {
    std::string joined;
    for (auto& i : inputs) joined += (joined.empty() ? "" : ",") + i;
    out.push_back(key + joined);
  }
  return out;
}

}  // namespace

int cmd_preprocess(const CommandArgs& a) {
  ConfigSchema schema = preprocess_schema();
  if (a.help) {
    fmt::print(
        "usage: nekton preprocess preprocess.input=FILE.jsonl[.zst][,...] "
        "preprocess.output_prefix=PREFIX [key=value ...]\n\n"
        "Tokenizes the `json_key` field of each JSONL line into a Megatron indexed dataset\n"
        "(PREFIX.bin/.idx), one document per line, as Megatron's preprocess_data.py "
        "--append-eod.\n\n"
        "{}",
        schema.help());
    return 0;
  }
  Config c = Config::load(schema, a.config_path, join_repeated_inputs(a.overrides));
  PreprocessOptions opt;
  opt.inputs = split_commas(c.get_string("preprocess.input"));
  if (opt.inputs.empty()) fail("preprocess.input: no input files (preprocess.input=FILE.jsonl)");
  opt.output_prefix = c.get_string("preprocess.output_prefix");
  if (opt.output_prefix.empty())
    fail("preprocess.output_prefix: no output given (preprocess.output_prefix=PREFIX)");
  opt.json_key = c.get_string("preprocess.json_key");
  opt.tokenizer = c.get_string("preprocess.tokenizer");
  opt.append_eod = c.get_bool("preprocess.append_eod");
  opt.workers = int(c.get_int("preprocess.workers"));
  opt.skip_bad = c.get_bool("preprocess.skip_bad");
  opt.invalid_utf8 = c.get_string("preprocess.invalid_utf8");
  opt.block_bytes = c.get_int("preprocess.block_bytes");
  opt.max_line_bytes = c.get_int("preprocess.max_line_bytes");
  std::string mode = c.get_string("preprocess.progress");
  if (mode == "auto") mode = ::isatty(STDERR_FILENO) ? "bar" : "log";
  if (mode != "bar" && mode != "log" && mode != "none")
    fail("preprocess.progress: must be auto, bar, log or none, got '{}'", mode);
  opt.progress_every_s = mode == "bar" ? 0.25 : 10.0;

  bool bar_shown = false;
  auto progress = [&](const PreprocessProgress& p) {
    if (mode == "bar") {
      fmt::print(stderr, "\r{}\x1b[K{}", format_progress(p), p.finished ? "\n" : "");
      bar_shown = !p.finished;
    } else if (mode == "log" && !p.finished) {
      fmt::print(stderr, "[info] preprocess {}\n", format_progress(p));
    }
    std::fflush(stderr);
  };
  std::function<void(const PreprocessProgress&)> callback;
  if (mode != "none") callback = progress;
  PreprocessStats st;
  try {
    st = preprocess_jsonl(opt, callback);
  } catch (...) {
    if (bar_shown) fmt::print(stderr, "\n");  // the error goes on a line of its own
    throw;
  }
  fmt::print("wrote {0}.bin and {0}.idx: {1}", opt.output_prefix, st.summary());
  return 0;
}

}  // namespace nk
