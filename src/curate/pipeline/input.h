// The inputs of a curation pipeline, cut into shards: each JSONL file is a
// shard of its own, or, for a plain (not zstd) file larger than shard_mb,
// several shards of about shard_mb each, cut at line ends; each WARC or WET
// file (plain or gzip) is a shard; plain text, HTML and LaTeX files (given one
// by one or found in folders) are documents, grouped files_per_shard to a
// shard in path order. A shard is the unit of output files and of resume.
//
// A WARC file gives one document per `response` record whose HTTP status is
// 2xx and whose Content-Type is text/html or application/xhtml+xml (the page,
// transcoded to UTF-8: see charset.h; meta "format": "html", so html_to_text
// extracts it), and one per `conversion` record (WET's plain text, "format":
// "text"); the id is WARC-Record-ID, and the fields url (WARC-Target-URI),
// date (WARC-Date), source (FILE@OFFSET), charset and charset_from (header,
// meta, detected, bom, default) are added. Other records are skipped and
// counted by kind (ShardReader::counts); damaged ones are bad records naming
// the file and byte offset.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "curate/document.h"
#include "curate/pipeline/record.h"
#include "curate/pipeline/warc.h"
#include "data/jsonl_reader.h"

namespace nk::curate {

enum class SourceFormat { Jsonl, Text, Html, Latex, Warc, Wet };
// "jsonl", "text", "html", "latex", "warc", "wet"
const char* source_format_name(SourceFormat f);

struct InputOptions {
  std::vector<std::string> paths;  // files and folders (searched recursively)
  // auto (by extension), jsonl, text, html, latex, warc, wet
  std::string format = "auto";
  std::string text_key = "text", id_key = "id";  // JSONL fields
  int64_t files_per_shard = 1000;
  int64_t shard_mb = 256;                // plain JSONL files larger than this are split; 0: never
  std::string invalid_utf8 = "replace";  // replace (with U+FFFD, counted) or skip
};

struct Shard {
  SourceFormat format = SourceFormat::Jsonl;  // Jsonl, Warc, Wet: files has one entry
  std::vector<std::pair<std::string, SourceFormat>> files;
  int64_t bytes = 0;  // on disk
  // A part of a plain JSONL file: bytes [offset, offset + bytes), starting at
  // line first_line. offset < 0: the whole file.
  int64_t offset = -1, first_line = 1;
};

// nk::Error naming the path when one is missing or unreadable, or when nothing
// usable is found. Files of unknown type inside folders are skipped with a
// warning (format=auto); a file named directly is read as text. Folders are
// walked through symbolic links; a link loop is skipped with a warning naming
// it (an error when the input holds nothing else). File names are bytes and
// need not be UTF-8.
std::vector<Shard> plan_shards(const InputOptions& opt);

// One input record: a document, or why it could not be read.
struct InputRecord {
  Document doc;
  bool ok = true;
  std::string error;      // when !ok: "invalid JSON: ...", "cannot read: ..."
  std::string where;      // "file:line", the file's path, or "file@offset" (WARC)
  bool repaired = false;  // invalid UTF-8 replaced by U+FFFD
  int64_t bytes = 0;      // input bytes it came from
};

// Reads a shard in batches of about `batch_bytes`, in order. Parsing runs in
// parallel over the thread pool; records keep their order.
class ShardReader {
 public:
  ShardReader(const Shard& shard, const InputOptions& opt);
  ~ShardReader();
  // Replaces `out` with the next records; false at the end.
  bool next(std::vector<InputRecord>& out, size_t batch_bytes);
  int64_t bytes_done() const { return bytes_done_; }  // on disk, for progress
  // What the reader skipped or noticed, by name (WARC: "warc_skipped_request",
  // "warc_corrupt_records", "charset_detected", ...); empty for other inputs.
  const Counters& counts() const { return counts_; }

 private:
  bool next_warc(std::vector<InputRecord>& out, size_t batch_bytes);

  const Shard& shard_;
  const InputOptions& opt_;
  std::unique_ptr<JsonlReader> jsonl_;
  struct WarcState;
  std::unique_ptr<WarcState> warc_;
  Counters counts_;
  size_t next_file_ = 0;
  int64_t bytes_done_ = 0;
};

}  // namespace nk::curate
