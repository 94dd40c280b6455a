#include <fmt/format.h>

#include <cstdio>
#include <functional>

#include "apps/commands.h"
#include "core/config_bind.h"
#include "core/error.h"
#include "core/progress.h"
#include "data/data_config.h"
#include "data/preprocess.h"

namespace nk {

namespace {

// The preprocess.* keys and the data.* keys preprocessing shares with
// training: the dataset it writes is the one training reads as data.prefix.
struct PreprocessKeys {
  std::string input;  // comma-separated
  std::string progress = "auto";
  DataConfig data;
  PreprocessOptions opt;

  PreprocessKeys() { data.tokenizer = opt.tokenizer; }  // bytes, as preprocess always did
  void bind(ConfigBinder& b) {
    b.bind("preprocess.input", input,
           "JSONL files, plain or zstd: comma-separated, or the key given several times");
    b.bind("preprocess.json_key", opt.json_key, "the JSON field that holds each document's text");
    b.bind_only(
        {{"data.prefix", "writes PREFIX.bin and PREFIX.idx (Megatron format)"},
         {"data.tokenizer", "tokenizer: bytes, gpt2, cl100k_base, ..., a BPE folder or FILE.model"},
         {"data.invalid_utf8",
          "invalid UTF-8 in a record: error (a bad record), or replace (with U+FFFD)"}},
        [&](ConfigBinder& d) { data.bind(d); });
    b.bind("preprocess.append_eod", opt.append_eod, "end-of-document token after each document");
    b.bind("preprocess.prepend_bos", opt.prepend_bos,
           "the tokenizer's beginning-of-document token (<s>, <|begin_of_text|>) before each "
           "document");
    b.bind("preprocess.workers", opt.workers, "tokenizing threads (0 = all cores)");
    b.bind("preprocess.skip_bad", opt.skip_bad,
           "skip and count bad records (bad JSON, missing key, non-string, bad UTF-8)");
    b.bind("preprocess.block_bytes", opt.block_bytes,
           "bytes of lines a worker takes at once (memory grows with it x workers)");
    b.bind("preprocess.max_line_bytes", opt.max_line_bytes, "longest line accepted");
    b.bind("preprocess.progress", progress,
           "auto (a bar on a terminal, else a log line every 10 s), bar, log or none");
    // The names these keys had before preprocessing shared the data.* group.
    b.alias("preprocess.output_prefix", "data.prefix");
    b.alias("preprocess.tokenizer", "data.tokenizer");
    b.alias("preprocess.invalid_utf8", "data.invalid_utf8");
  }
};

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
  ConfigSchema schema = schema_of([](ConfigBinder& b) { PreprocessKeys().bind(b); });
  if (a.help) {
    fmt::print(
        "usage: nekton preprocess preprocess.input=FILE.jsonl[.zst][,...] "
        "data.prefix=PREFIX [key=value ...]\n\n"
        "Tokenizes the `json_key` field of each JSONL line into a Megatron indexed dataset\n"
        "(PREFIX.bin/.idx), one document per line, as Megatron's preprocess_data.py "
        "--append-eod.\n"
        "data.prefix and data.tokenizer are the keys `nekton train` reads the dataset with.\n\n"
        "{}",
        schema.help());
    return 0;
  }
  Config c = Config::load(schema, a.config_path, join_repeated_inputs(a.overrides));
  PreprocessKeys k;
  ConfigReader reader(c);
  k.bind(reader);
  PreprocessOptions& opt = k.opt;
  opt.inputs = split_commas(k.input);
  if (opt.inputs.empty()) fail("preprocess.input: no input files (preprocess.input=FILE.jsonl)");
  opt.output_prefix = k.data.prefix;
  if (opt.output_prefix.empty())
    fail("data.prefix: no output given (data.prefix=PREFIX, or preprocess.output_prefix=PREFIX)");
  opt.tokenizer = k.data.tokenizer.empty() ? "bytes" : k.data.tokenizer;
  opt.invalid_utf8 = k.data.replace_invalid_utf8 ? "replace" : "error";
  Progress bar("preprocess", parse_progress_mode(k.progress, "preprocess.progress"));
  opt.progress_every_s = bar.every_s();
  std::function<void(const PreprocessProgress&)> callback;
  // Log mode: no final line, the summary below says it all.
  if (bar.mode() != ProgressMode::None)
    callback = [&](const PreprocessProgress& p) {
      if (!p.finished || bar.mode() == ProgressMode::Bar) bar.show(format_progress(p), p.finished);
    };
  PreprocessStats st;
  st = preprocess_jsonl(opt, callback);  // on an error, bar's destructor ends its line
  fmt::print("wrote {0}.bin and {0}.idx: {1}", opt.output_prefix, st.summary());
  return 0;
}

}  // namespace nk
