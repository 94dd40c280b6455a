#include "apps/commands.h"

#include <fmt/format.h>

#include <algorithm>

#include "apps/arg_parser.h"
#include "core/error.h"
#include "curate/classify/classifier_train.h"

namespace nk {

namespace {

const char* kClassifierUsage =
    "usage: nekton curate train-classifier --input FILE.jsonl --output MODEL.bin [options]\n"
    "\n"
    "Trains a fastText classifier (e.g. high vs low quality) on labelled JSONL (plain or\n"
    "zstd-compressed) for the `classifier` stage of a curation pipeline. A deterministic\n"
    "part of the records, chosen by a hash of the text, is held out and the precision,\n"
    "recall and F1 of every label on it are printed. The model is written atomically.\n";

}  // namespace

int cmd_curate_train_classifier(const std::vector<std::string>& args) {
  const char* cmd = "curate train-classifier";
  size_t from = !args.empty() && args[0] == "train-classifier" ? 1 : 0;
  CommandLine cl(cmd, args, from);
  curate::ClassifierTrainOptions o;
  cl.bind("--input", o.input, "JSONL records with a text and a label field (required)");
  cl.bind("--output", o.output, "the model to write (required)");
  cl.bind("--text-key", o.text_key, "field with the text");
  cl.bind("--label-key", o.label_key,
          "field with the label, a string or a number; stored as __label__<value>");
  cl.bind("--epoch", o.epoch, "passes over the data");
  cl.bind("--lr", o.lr, "learning rate");
  cl.bind("--word-ngrams", o.word_ngrams, "word n-gram length");
  cl.bind("--dim", o.dim, "vector size");
  cl.bind("--min-count", o.min_count, "drop words seen fewer times");
  cl.bind("--bucket", o.bucket,
          "hashed n-gram rows when --word-ngrams > 1 (the model takes about (words + N) * dim * "
          "4 bytes)");
  cl.bind("--threads", o.threads,
          "training threads (1: reproducible; more is faster but not bit-reproducible)");
  cl.bind("--valid-fraction", o.valid_fraction, "part held out for evaluation, in [0, 1)");
  cl.bind("--seed", o.seed, "seed of the split and of fastText");
  if (cl.help()) {
    fmt::print("{}", cl.help_text(kClassifierUsage));
    return 0;
  }
  std::vector<std::string> pos = cl.finish();
  if (!pos.empty()) fail("{}: unexpected argument '{}' (see --help)", cmd, pos[0]);
  if (o.input.empty() || o.output.empty()) {
    fmt::print(stderr, "{}", kClassifierUsage);
    fail("{}: --input and --output are required", cmd);
  }
  curate::ClassifierTrainReport r = curate::train_quality_classifier(o);
  fmt::print("{}", curate::format_train_report(o, r));
  return 0;
}

}  // namespace nk
