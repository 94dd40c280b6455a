// JSONL (plain or zstd) to a Megatron indexed dataset, as Megatron's
// tools/preprocess_data.py does with --append-eod: one document per line, the
// text of one string field, tokenized, followed by the end-of-document id
// (and, with prepend_bos, after the tokenizer's BOS id, as Llama-family
// pretraining data starts each document).
//
// A pipeline in bounded memory: one reader thread cuts the input into blocks
// of whole lines, `workers` threads parse and tokenize blocks in parallel, and
// the calling thread appends the results to PREFIX.bin/.idx strictly in input
// order. At most 2 x workers blocks are in flight, so memory does not grow with
// the input. The tokenizer is shared by the workers: Tokenizer::encode is const
// and must be safe to call from several threads at once.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace nk {

struct PreprocessOptions {
  std::vector<std::string> inputs;  // JSONL files, plain or zstd (by magic bytes)
  std::string json_key = "text";    // the top-level string field that holds a document
  std::string tokenizer = "bytes";  // a load_tokenizer() spec
  std::string output_prefix;        // writes output_prefix.bin and output_prefix.idx
  bool append_eod = true;           // eod_id() after each document
  bool prepend_bos = false;         // bos_id() before each document (Llama-family data)
  int workers = 0;                  // tokenizing threads; <= 0: all cores
  // A bad record (invalid JSON, missing key, non-string field, invalid UTF-8)
  // stops the run with an nk::Error naming file:line unless skip_bad is set,
  // in which case it is skipped and counted by cause.
  bool skip_bad = false;
  // "error": invalid UTF-8 makes a record bad; "replace": each maximal
  // ill-formed subsequence becomes U+FFFD and the record is kept.
  std::string invalid_utf8 = "error";
  // Lines handed to a worker at once. Memory is about 2 x (2 x workers + 2)
  // blocks of text and their int32 tokens (5 x block_bytes each for "bytes").
  int64_t block_bytes = int64_t(1) << 20;
  int64_t max_line_bytes = int64_t(1) << 30;  // longer lines are an error (corrupt input)
  double progress_every_s = 0.25;             // least time between progress calls
};

// Where the run is; what the progress callback receives.
struct PreprocessProgress {
  int64_t input_bytes_done = 0;   // file bytes behind the written documents (compressed for zstd)
  int64_t input_bytes_total = 0;  // sum of the input file sizes
  int64_t text_bytes = 0;         // JSONL bytes behind the written documents
  int64_t documents = 0, tokens = 0;
  double seconds = 0;
  bool finished = false;  // the last call, after the output is in place
};

struct PreprocessStats {
  int64_t documents = 0;        // written
  int64_t tokens = 0;           // written, end-of-document ids included
  int64_t lines = 0;            // read, blank lines included
  int64_t input_bytes = 0;      // read from the files (compressed size for zstd)
  int64_t text_bytes = 0;       // of JSONL text
  int64_t blank_lines = 0;      // whitespace-only lines, ignored
  int64_t empty_documents = 0;  // no tokens (empty text); dropped as Megatron does
  int64_t invalid_json = 0, missing_key = 0, not_string = 0, invalid_utf8 = 0;  // skipped
  int64_t utf8_replaced_records = 0;          // records kept with U+FFFD (invalid_utf8=replace)
  std::vector<std::string> skipped_examples;  // the first few skipped records, "file:line: why"
  int workers = 0;
  std::string dtype;  // of the tokens in .bin: "uint16" or "int32"
  double seconds = 0;

  int64_t skipped_bad() const { return invalid_json + missing_key + not_string + invalid_utf8; }
  double text_mb_per_s() const;
  // A few lines for people: counts, sizes, time, MB/s (total and per worker), skips.
  std::string summary() const;
};

// Runs the pipeline; on any error (unreadable input, a bad record without
// skip_bad, a truncated zstd stream, a token that does not fit) it throws
// nk::Error naming the file and line (or compressed byte offset), and no
// .bin/.idx is left under the final names. `progress` (may be empty) is called
// from the calling thread at most every progress_every_s, and once at the end.
PreprocessStats preprocess_jsonl(const PreprocessOptions& opt,
                                 const std::function<void(const PreprocessProgress&)>& progress);

// One status line: a bar of input bytes done, percent, MB/s, docs/s, ETA.
std::string format_progress(const PreprocessProgress& p, int bar_width = 24);

}  // namespace nk
