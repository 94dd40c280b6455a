#include "apps/commands.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <type_traits>

#include "apps/arg_parser.h"
#include "core/error.h"
#include "curate/classify/classifier_train.h"

namespace nk {

namespace {

const char* kUsage =
    "usage: nekton curate train-classifier --input FILE.jsonl --output MODEL.bin [options]\n"
    "\n"
    "Trains a fastText classifier (e.g. high vs low quality) on labelled JSONL (plain or\n"
    "zstd-compressed) for the `classifier` stage of a curation pipeline. A deterministic\n"
    "part of the records, chosen by a hash of the text, is held out and the precision,\n"
    "recall and F1 of every label on it are printed. The model is written atomically.\n"
    "\n"
    "options:\n"
    "  --input FILE          JSONL records with a text and a label field (required)\n"
    "  --output FILE         the model to write (required)\n"
    "  --text-key KEY        field with the text (default text)\n"
    "  --label-key KEY       field with the label, a string or a number (default label);\n"
    "                        stored as __label__<value>, e.g. hq -> __label__hq\n"
    "  --epoch N             passes over the data (default 5)\n"
    "  --lr X                learning rate (default 0.1)\n"
    "  --word-ngrams N       word n-gram length (default 2)\n"
    "  --dim N               vector size (default 100)\n"
    "  --min-count N         drop words seen fewer times (default 1)\n"
    "  --bucket N            hashed n-gram rows when --word-ngrams > 1 (default 2000000;\n"
    "                        the model takes about (words + N) * dim * 4 bytes)\n"
    "  --threads N           training threads (default 1: reproducible; more is faster\n"
    "                        but not bit-reproducible)\n"
    "  --valid-fraction X    part held out for evaluation, in [0, 1) (default 0.1)\n"
    "  --seed N              seed of the split and of fastText (default 1)\n";

}  // namespace

int cmd_curate_train_classifier(const std::vector<std::string>& args) {
  size_t from = !args.empty() && args[0] == "train-classifier" ? 1 : 0;
  if (std::any_of(args.begin() + long(from), args.end(),
                  [](const std::string& s) { return s == "--help" || s == "-h"; })) {
    fmt::print("{}", kUsage);
    return 0;
  }
  const char* cmd = "curate train-classifier";
  Parsed p = parse_options(cmd, args, from,
                           {{"--input", Arity::kOne},
                            {"--output", Arity::kOne},
                            {"--text-key", Arity::kOne},
                            {"--label-key", Arity::kOne},
                            {"--epoch", Arity::kOne},
                            {"--lr", Arity::kOne},
                            {"--word-ngrams", Arity::kOne},
                            {"--dim", Arity::kOne},
                            {"--min-count", Arity::kOne},
                            {"--bucket", Arity::kOne},
                            {"--threads", Arity::kOne},
                            {"--valid-fraction", Arity::kOne},
                            {"--seed", Arity::kOne}});
  if (!p.positional.empty())
    fail("{}: unexpected argument '{}' (see --help)", cmd, p.positional[0]);
  if (!p.has("--input") || !p.has("--output")) {
    fmt::print(stderr, "{}", kUsage);
    fail("{}: --input and --output are required", cmd);
  }
  curate::ClassifierTrainOptions o;
  o.input = p.one("--input");
  o.output = p.one("--output");
  if (p.has("--text-key")) o.text_key = p.one("--text-key");
  if (p.has("--label-key")) o.label_key = p.one("--label-key");
  auto int_opt = [&](const char* name, auto& field) {
    using T = std::remove_reference_t<decltype(field)>;
    if (!p.has(name)) return;
    int64_t v = parse_int(p.one(name), name);
    if (v < int64_t(std::numeric_limits<T>::min()) || v > int64_t(std::numeric_limits<T>::max()))
      fail("{}: {} is out of range", name, v);
    field = T(v);
  };
  int_opt("--epoch", o.epoch);
  int_opt("--word-ngrams", o.word_ngrams);
  int_opt("--dim", o.dim);
  int_opt("--min-count", o.min_count);
  int_opt("--bucket", o.bucket);
  int_opt("--threads", o.threads);
  if (p.has("--seed")) {
    int64_t s = parse_int(p.one("--seed"), "--seed");
    if (s < 0) fail("--seed: must be >= 0, got {}", s);
    o.seed = uint64_t(s);
  }
  if (p.has("--lr")) o.lr = parse_double(p.one("--lr"), "--lr");
  if (p.has("--valid-fraction"))
    o.valid_fraction = parse_double(p.one("--valid-fraction"), "--valid-fraction");
  curate::ClassifierTrainReport r = curate::train_quality_classifier(o);
  fmt::print("{}", curate::format_train_report(o, r));
  return 0;
}

}  // namespace nk
