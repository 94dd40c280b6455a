// Benchmark decontamination (GPT-3, Brown et al. 2020, appendix C; NeMo
// Curator's TaskDecontamination): a document that shares a word n-gram
// (default 13, lowercased words of split_words, so case and punctuation do not
// matter) with a benchmark sample is removed (`mode: drop`) or has the match
// cut out with some context on each side (`mode: cut`).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "curate/document.h"

namespace nk::curate {

struct DecontamOptions {
  // JSONL files whose `text_key` field holds one sample per line, or plain
  // text files with one sample per line (format "auto" tells them apart by
  // the extension .jsonl/.json, else by a first line starting with '{').
  std::vector<std::string> benchmarks;
  std::string text_key = "text";
  std::string format = "auto";  // auto | jsonl | text
  int n = 13;
  bool cut = false;               // mode: cut (else drop)
  int cut_context = 200;          // code points removed on each side of a match
  int min_document_length = 200;  // code points a piece needs to be kept
  int max_splits = 10;            // more pieces than this: the document goes
};

// Reads the benchmarks; nk::Error naming the file (and line) for a missing,
// unreadable or malformed file, or one without a single sample.
std::unique_ptr<DocStage> make_decontam_stage(const DecontamOptions& opt);

}  // namespace nk::curate
