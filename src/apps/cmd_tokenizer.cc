// `nekton tokenizer`: inspect, run and train tokenizers.
//   info SPEC | encode SPEC ... | decode SPEC ... | train --type ... --input ... --out ...
// Unlike the config-driven commands it takes positional arguments and options,
// parsed here. Every error is an nk::Error (exit 1) naming the argument or file;
// files are written atomically, so a failed run leaves no partial output.
#include <fmt/format.h>

#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "apps/arg_parser.h"
#include "apps/commands.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/progress.h"
#include "data/dataset/text_dataset.h"
#include "data/tokenizer/bpe_files.h"
#include "data/tokenizer/bpe_trainer.h"
#include "data/tokenizer/sentencepiece_tokenizer.h"
#include "data/tokenizer/tokenizer.h"

namespace nk {

namespace {

namespace fs = std::filesystem;

const char* kTokenizerUsage =
    "usage: nekton tokenizer <subcommand> [arguments] [--help]\n"
    "\n"
    "subcommands:\n"
    "  info SPEC [--count N]\n"
    "      kind, vocabulary size, end-of-document id, special tokens and the first N\n"
    "      tokens (default 10)\n"
    "  encode SPEC (--text TEXT | --input FILE|-) [--ids-only] [--per-line] [--specials]\n"
    "         [--output FILE]\n"
    "      token ids of the text; by default one token per line (id, then its bytes),\n"
    "      --ids-only: the ids on one line; --per-line: each input line encoded on its\n"
    "      own, one line of ids per input line (spm_encode --output_format=id);\n"
    "      --specials: special-token strings in the text become their ids\n"
    "  decode SPEC (ID... | --input FILE|-) [--output FILE]\n"
    "      the bytes of the ids (separated by spaces or commas), written as they are\n"
    "  train --type sentencepiece|bpe --input FILE... --vocab-size N --out DIR_OR_PREFIX\n"
    "        [--character-coverage X] [--input-sentence-size N] [--threads N]\n"
    "        [--user-defined-symbols A,B,...] [--verbose]\n"
    "      trains a tokenizer on text files (one sentence per line; .gz/.dz read\n"
    "      directly). sentencepiece uses Llama's settings (BPE, byte fallback, split\n"
    "      digits, identity normalization, dummy prefix, coverage 0.99995) and writes\n"
    "      PREFIX.model and PREFIX.vocab, or DIR/tokenizer.model and DIR/tokenizer.vocab\n"
    "      when --out is a folder or ends in '/'\n"
    "      bpe (byte-level, GPT-2/tiktoken style) counts pre-tokenized pieces on all\n"
    "      cores and merges the most frequent pair until --vocab-size (256 bytes +\n"
    "      merges + <|endoftext|>); --pattern gpt2|cl100k_base|o200k_base|REGEX\n"
    "      (default cl100k_base's), --min-frequency N (2), --max-bytes N (all);\n"
    "      writes DIR/vocab.tiktoken, tokenizer.json, encoder.json + vocab.bpe\n"
    "\n"
    "SPEC: \"bytes\" (one id per byte + end-of-text), gpt2 | r50k_base | p50k_base |\n"
    "cl100k_base | o200k_base (OpenAI's, from the fetched assets), FILE.tiktoken, a\n"
    "folder with encoder.json + vocab.bpe, saved by `train --type bpe`, or with Hugging\n"
    "Face's tokenizer.json of a byte-level BPE (Llama 3, Qwen2, GPT-2; or the path of\n"
    "that tokenizer.json, or FILE.json), or FILE.model (SentencePiece).\n"
    "Encoded text never gets <s>/</s> added; preprocess appends the end-of-document id.\n";

std::string read_input(const std::string& path) {
  if (path == "-") {
    std::ostringstream ss;
    ss << std::cin.rdbuf();
    return ss.str();
  }
  if (fs::is_directory(path)) fail("input '{}': is a directory", path);
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("input '{}': cannot open: {}", path, std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("input '{}': read error", path);
  return ss.str();
}

// Writes to stdout, or atomically to `path` when one is given.
void emit(const std::string& path, const std::string& bytes) {
  if (!path.empty()) {
    write_file_atomic(path, bytes);
    return;
  }
  std::fwrite(bytes.data(), 1, bytes.size(), stdout);
  std::fflush(stdout);
}

// Token bytes for display: valid UTF-8 as is, control and invalid bytes escaped.
std::string show(const std::string& s) {
  bool utf8 = find_invalid_utf8(s) < 0;
  std::string out;
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else if (c < 0x20 || c == 0x7f || (c >= 0x80 && !utf8))
      out += fmt::format("\\x{:02x}", c);
    else
      out.push_back(char(c));
  }
  return out;
}

std::unique_ptr<Tokenizer> open_spec(const std::vector<std::string>& pos, const std::string& sub) {
  if (pos.empty()) fail("tokenizer {}: no tokenizer given (SPEC: bytes or FILE.model)", sub);
  return load_tokenizer(pos[0]);
}

// `tokenizer SUB --help`: the usage, then SUB's options.
int print_help(const CommandLine& cl) {
  fmt::print("{}", cl.help_text(kTokenizerUsage));
  return 0;
}

int cmd_info(const std::vector<std::string>& args) {
  CommandLine cl("tokenizer info", args, 1);
  int64_t count = 10;
  cl.bind("--count", count, "the first N tokens listed");
  if (cl.help()) return print_help(cl);
  std::vector<std::string> pos = cl.finish();
  if (pos.size() > 1) fail("tokenizer info: unexpected argument '{}' (usage: info SPEC)", pos[1]);
  auto tok = open_spec(pos, "info");
  if (count < 0) fail("--count: must be >= 0, got {}", count);
  std::string out;
  out += fmt::format("tokenizer:      {}\n", pos[0]);
  std::string kind = tok->kind();
  if (auto* sp = dynamic_cast<SentencePieceTokenizer*>(tok.get()))
    kind += fmt::format(" ({})", sp->model_type());
  out += fmt::format("kind:           {}\n", kind);
  out += fmt::format("vocab size:     {}\n", tok->vocab_size());
  int32_t eod = tok->eod_id();
  out += eod >= 0 ? fmt::format("eod id:         {} {}\n", eod, show(tok->token_bytes(eod)))
                  : std::string("eod id:         none\n");
  if (auto* sp = dynamic_cast<SentencePieceTokenizer*>(tok.get()))
    out += fmt::format("bos id:         {}\n", sp->bos_id());
  auto specials = tok->special_tokens();
  out += fmt::format("special tokens: {}\n", specials.size());
  for (auto& [text, id] : specials) out += fmt::format("  {:>8}  {}\n", id, show(text));
  int64_t n = std::min<int64_t>(count, tok->vocab_size());
  out += fmt::format("first {} tokens:\n", n);
  for (int64_t id = 0; id < n; ++id) {
    std::string shown = show(tok->token_bytes(int32_t(id)));
    if (auto* sp = dynamic_cast<SentencePieceTokenizer*>(tok.get()))
      shown = fmt::format("{:<12} piece {}", shown, show(sp->piece(int32_t(id))));
    out += fmt::format("  {:>8}  {}\n", id, shown);
  }
  emit("", out);
  return 0;
}

int cmd_encode(const std::vector<std::string>& args) {
  CommandLine cl("tokenizer encode", args, 1);
  std::string text, input, output;
  bool ids_only = false, per_line = false, specials = false;
  bool has_text = cl.bind("--text", text, "the text to encode");
  bool has_input = cl.bind("--input", input, "file with the text to encode (- = stdin)");
  cl.bind("--ids-only", ids_only, "only the ids, on one line");
  cl.bind("--per-line", per_line, "each input line encoded on its own, a line of ids for each");
  cl.bind("--specials", specials, "special-token strings in the text become their ids");
  cl.bind("--output", output, "write to this file instead of stdout");
  if (cl.help()) return print_help(cl);
  std::vector<std::string> pos = cl.finish();
  if (pos.size() > 1)
    fail("tokenizer encode: unexpected argument '{}' (text goes after --text)", pos[1]);
  if (has_text == has_input)
    fail("tokenizer encode: give the text with exactly one of --text TEXT or --input FILE");
  auto tok = open_spec(pos, "encode");
  if (has_input) text = read_input(input);
  auto enc = [&](std::string_view s, std::vector<int32_t>& ids) {
    if (specials)
      tok->encode_with_specials(s, ids);
    else
      tok->encode(s, ids);
  };
  std::string out;
  if (per_line) {
    // As spm_encode reads: std::getline, so no line after a final '\n'.
    size_t at = 0;
    while (at < text.size()) {
      size_t nl = text.find('\n', at);
      size_t end = nl == std::string::npos ? text.size() : nl;
      std::vector<int32_t> ids;
      enc(std::string_view(text).substr(at, end - at), ids);
      out += fmt::format("{}\n", fmt::join(ids, " "));
      at = nl == std::string::npos ? text.size() : nl + 1;
    }
  } else {
    std::vector<int32_t> ids;
    enc(text, ids);
    if (ids_only) {
      out = fmt::format("{}\n", fmt::join(ids, " "));
    } else {
      for (int32_t id : ids) out += fmt::format("{}\t{}\n", id, show(tok->token_bytes(id)));
      out += fmt::format("{} tokens for {} bytes\n", ids.size(), text.size());
    }
  }
  emit(output, out);
  return 0;
}

// Ids separated by whitespace or commas (brackets allowed around the list).
void parse_ids(const std::string& s, const std::string& where, std::vector<int32_t>& ids) {
  size_t i = 0;
  while (i < s.size()) {
    char c = s[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',' || c == '[' || c == ']') {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < s.size() && !std::strchr(" \t\n\r,[]", s[j])) ++j;
    std::string w = s.substr(i, j - i);
    int64_t v = 0;
    auto [end, ec] = std::from_chars(w.data(), w.data() + w.size(), v);
    if (ec != std::errc() || end != w.data() + w.size())
      fail("tokenizer decode: {}: '{}' is not a token id", where, w);
    if (v < INT32_MIN || v > INT32_MAX)
      fail("tokenizer decode: {}: token id {} is out of range", where, w);
    ids.push_back(int32_t(v));
    i = j;
  }
}

int cmd_decode(const std::vector<std::string>& args) {
  CommandLine cl("tokenizer decode", args, 1);
  std::string input, output;
  bool has_input = cl.bind("--input", input, "file of ids (- = stdin), instead of arguments");
  cl.bind("--output", output, "write to this file instead of stdout");
  if (cl.help()) return print_help(cl);
  std::vector<std::string> pos = cl.finish();
  auto tok = open_spec(pos, "decode");
  std::vector<int32_t> ids;
  if (has_input) {
    if (pos.size() > 1)
      fail("tokenizer decode: give ids either as arguments or with --input, not both");
    const std::string& path = input;
    std::string text = read_input(path);
    size_t line_start = 0;
    for (int64_t line = 1; line_start <= text.size(); ++line) {
      size_t nl = text.find('\n', line_start);
      size_t end = nl == std::string::npos ? text.size() : nl;
      parse_ids(text.substr(line_start, end - line_start),
                fmt::format("'{}' line {}", path == "-" ? "stdin" : path, line), ids);
      if (nl == std::string::npos) break;
      line_start = nl + 1;
    }
  } else {
    if (pos.size() < 2) fail("tokenizer decode: no token ids given");
    for (size_t i = 1; i < pos.size(); ++i)
      parse_ids(pos[i], fmt::format("argument {}", i + 1), ids);
  }
  std::string bytes;
  try {
    bytes = tok->decode(ids);
  } catch (const Error& e) {
    throw e.with_context("tokenizer decode");
  }
  emit(output, bytes);
  return 0;
}

// `tokenizer train`'s options: both kinds' in one list, each kind refusing
// the other's.
struct TrainArgs {
  std::string type = "sentencepiece", out, user_symbols, pattern;
  std::vector<std::string> inputs;
  int64_t vocab_size = 0, max_bytes = 0;
  int threads = 0;
  std::string progress = "auto";
  SentencePieceTrainOptions sp;
  BpeTrainOptions bpe;

  void bind(CommandLine& cl) {
    cl.bind("--type", type, "sentencepiece or bpe");
    cl.bind("--input", inputs, "text files, one sentence per line (.gz/.dz read directly)");
    cl.bind("--vocab-size", vocab_size, "tokens in the vocabulary (required)");
    cl.bind("--out", out, "sentencepiece: PREFIX or DIR/; bpe: DIR (required)");
    cl.bind("--character-coverage", sp.character_coverage,
            "sentencepiece: characters covered by the vocabulary");
    cl.bind("--input-sentence-size", sp.input_sentence_size,
            "sentencepiece: sentences sampled from the input (0 = all)");
    cl.bind("--threads", threads, "training threads (0 = all cores)");
    cl.bind("--user-defined-symbols", user_symbols, "sentencepiece: A,B,... kept as single tokens");
    cl.bind("--verbose", sp.verbose, "sentencepiece: its own training log");
    cl.bind("--pattern", pattern,
            "bpe: pre-tokenization gpt2, cl100k_base, o200k_base or a REGEX (default "
            "cl100k_base's)");
    cl.bind("--min-frequency", bpe.min_frequency, "bpe: stop before merging a rarer pair");
    cl.bind("--max-bytes", max_bytes, "bpe: read at most this many bytes (0 = all)");
    cl.bind("--progress", progress,
            "bpe: the merges done; sentencepiece: the time its trainer has run; auto (an "
            "updating line on a terminal, else a log line every 10 s), bar, log or none");
  }
  // --input, --out (named `out_kind` in the message) and --vocab-size are given.
  void require(const CommandLine& cl, const char* out_kind) const {
    if (!cl.has("--input")) fail("tokenizer train: no --input FILE given");
    if (!cl.has("--out")) fail("tokenizer train: no --out {} given", out_kind);
    if (!cl.has("--vocab-size")) fail("tokenizer train: no --vocab-size N given");
    if (out.empty()) fail("--out: empty path");
  }
};

// Byte-level BPE (GPT-2/tiktoken style): DIR gets vocab.tiktoken,
// tokenizer.json and encoder.json + vocab.bpe.
int train_bpe_command(const CommandLine& cl, TrainArgs& t) {
  for (const char* sp : {"--character-coverage", "--input-sentence-size", "--user-defined-symbols"})
    if (cl.has(sp)) fail("tokenizer train: {} is a sentencepiece option", sp);
  t.require(cl, "DIR");
  BpeTrainOptions& o = t.bpe;
  o.vocab_size = t.vocab_size;
  o.threads = t.threads;
  if (!t.pattern.empty())
    o.pattern = is_openai_encoding(t.pattern) ? openai_pattern(t.pattern) : t.pattern;
  if (t.max_bytes < 0) fail("--max-bytes: must be >= 0, got {}", t.max_bytes);
  const std::string& out = t.out;
  o.name = fs::path(out).filename().string();
  if (o.name.empty()) o.name = fs::path(out).parent_path().filename().string();
  auto t0 = std::chrono::steady_clock::now();
  BpeVocab v;
  {
    Progress bar("tokenizer train", parse_progress_mode(t.progress, "tokenizer train: --progress"));
    v = train_bpe_from_files(t.inputs, o, t.max_bytes, [&](int64_t done, int64_t want) {
      if (done == 1) bar.start(double(want), "merges");
      bar.set_done(double(done));
    });
    bar.finish();
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  save_bpe_tokenizer(v, out);
  fmt::print("trained bpe tokenizer: {} tokens ({} merges) in {:.1f} s\nwrote {}\n",
             v.tokens.size() + v.specials.size(), v.tokens.size() - 256, secs, out);
  return 0;
}

int cmd_train_tokenizer(const std::vector<std::string>& args) {
  CommandLine cl("tokenizer train", args, 1);
  TrainArgs t;
  t.bind(cl);
  if (cl.help()) return print_help(cl);
  std::vector<std::string> pos = cl.finish();
  if (!pos.empty())
    fail("tokenizer train: unexpected argument '{}' (input files go after --input)", pos[0]);
  if (t.type == "bpe") return train_bpe_command(cl, t);
  if (t.type != "sentencepiece")
    fail("tokenizer train: --type must be sentencepiece or bpe, got '{}'", t.type);
  t.require(cl, "DIR_OR_PREFIX");
  SentencePieceTrainOptions& o = t.sp;
  o.inputs = t.inputs;
  o.vocab_size = t.vocab_size;
  if (o.vocab_size <= 0) fail("--vocab-size: must be > 0, got {}", o.vocab_size);
  o.num_threads = t.threads;
  const std::string& s = t.user_symbols;
  for (size_t at = 0; at <= s.size();) {
    size_t c = s.find(',', at);
    if (c == std::string::npos) c = s.size();
    if (c > at) o.user_defined_symbols.push_back(s.substr(at, c - at));
    at = c + 1;
  }

  const std::string& out = t.out;
  std::string prefix;
  if (out.back() == '/' || fs::is_directory(out)) {
    fs::create_directories(out);
    prefix = (fs::path(out) / "tokenizer").string();
  } else {
    prefix = out;
    fs::path parent = fs::path(out).parent_path();
    if (!parent.empty()) fs::create_directories(parent);
  }
  auto t0 = std::chrono::steady_clock::now();
  std::string model;
  {
    // SentencePiece's trainer reports nothing to a caller: the time it has
    // run, shown at once (so even a training shorter than a tick says it
    // started) and updated four times a second beside it (its own log:
    // --verbose).
    Progress bar("tokenizer train", parse_progress_mode(t.progress, "tokenizer train: --progress"));
    auto tick = [&] {
      bar.show(fmt::format(
          "sentencepiece: training {} file(s), {:.0f} s", o.inputs.size(),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
    };
    tick();
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::thread ticker([&] {
      std::unique_lock<std::mutex> lock(mu);
      while (!cv.wait_for(lock, std::chrono::milliseconds(250), [&] { return done; })) tick();
    });
    auto stop = [&] {
      {
        std::lock_guard<std::mutex> lock(mu);
        done = true;
      }
      cv.notify_all();
      ticker.join();
      bar.end_line();
    };
    try {
      model = train_sentencepiece(o);
    } catch (...) {
      stop();
      throw;
    }
    stop();
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto tok = SentencePieceTokenizer::from_bytes(model, prefix + ".model");
  std::string vocab = tok->vocab_text();
  // Both temporaries are complete before either is renamed into place.
  AtomicFileWriter fm(prefix + ".model"), fv(prefix + ".vocab");
  fm.write(model.data(), model.size());
  fv.write(vocab.data(), vocab.size());
  fm.commit();
  fv.commit();
  fmt::print("trained sentencepiece ({}) tokenizer: {} tokens from {} file(s) in {:.1f} s\n",
             tok->model_type(), tok->vocab_size(), o.inputs.size(), secs);
  fmt::print("wrote {}.model and {}.vocab\n", prefix, prefix);
  return 0;
}

}  // namespace

int cmd_tokenizer(const CommandArgs& a) {
  const auto& args = a.args;
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    fmt::print("{}", kTokenizerUsage);
    return args.empty() ? 1 : 0;
  }
  const std::string& sub = args[0];
  static const std::map<std::string, int (*)(const std::vector<std::string>&)> subs = {
      {"info", cmd_info},
      {"encode", cmd_encode},
      {"decode", cmd_decode},
      {"train", cmd_train_tokenizer}};
  auto it = subs.find(sub);
  if (it == subs.end())
    fail(
        "tokenizer: unknown subcommand '{}' (info, encode, decode, train; see `nekton "
        "tokenizer --help`)",
        sub);
  return it->second(args);  // each prints its own --help
}

}  // namespace nk
