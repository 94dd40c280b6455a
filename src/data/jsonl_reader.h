// JSON Lines input: a streaming reader of lines from a plain or zstd-compressed
// file (found by its magic bytes, whatever its name), and the extraction of one
// string field from a line. Memory is bounded by the block size asked for plus
// the longest line; the file is never loaded whole.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace nk {

// Readable bytes that must follow a line handed to JsonFieldReader (simdjson's
// SIMDJSON_PADDING); LineBlock provides them.
inline constexpr size_t kJsonPadding = 64;

// Whole lines of one file, each ending in '\n' (one is added to a last line
// that has none), followed by kJsonPadding spaces.
struct LineBlock {
  int64_t first_line = 0;  // 1-based number of the block's first line in its file
  int64_t num_lines = 0;
  size_t size = 0;        // bytes of lines; bytes.size() == size + kJsonPadding
  int64_t input_end = 0;  // file bytes consumed when the block was cut (compressed for zstd)
  std::string bytes;

  std::string_view lines() const { return {bytes.data(), size}; }
};

class JsonlReader {
 public:
  // Opens `path`; nk::Error naming it when it is missing, unreadable, a folder,
  // or gzip-compressed. A line longer than max_line_bytes is an nk::Error
  // naming its line number (the bound keeps memory finite on a corrupt file).
  explicit JsonlReader(const std::string& path, int64_t max_line_bytes = int64_t(1) << 30);
  ~JsonlReader();
  JsonlReader(const JsonlReader&) = delete;
  JsonlReader& operator=(const JsonlReader&) = delete;

  // Reads only bytes [offset, offset + length) of a plain (not zstd) file,
  // whose first line is line `first_line` of the file; the range must start at
  // a line start. Call before the first read. bytes_consumed() then counts
  // from `offset`.
  void restrict_to(int64_t offset, int64_t length, int64_t first_line);

  const std::string& path() const { return path_; }
  bool zstd() const { return zstd_; }
  int64_t file_bytes() const { return file_bytes_; }    // size on disk; 0 if not a regular file
  int64_t bytes_consumed() const { return consumed_; }  // of the file (compressed for zstd)
  int64_t bytes_decoded() const { return decoded_; }    // of JSONL text

  // Replaces `block` with the next whole lines: at least target_bytes of them
  // unless the file ends first. False when no lines are left. A corrupt or
  // truncated zstd stream is an nk::Error naming the file, the compressed byte
  // offset and the line being read; the whole lines decoded before it are
  // returned first, and the error comes with the next call.
  bool read_block(LineBlock& block, size_t target_bytes);

  // The next line without its '\n' (view valid until the next call) and its
  // 1-based number; false at the end.
  bool read_line(std::string_view& line, int64_t& line_no);

 private:
  size_t fill(char* dst, size_t cap);  // decoded bytes into dst; 0 only at the end
  size_t read_raw(char* dst, size_t cap);

  std::string path_;
  int fd_ = -1;
  bool zstd_ = false;
  struct ZstdState;
  std::unique_ptr<ZstdState> zs_;
  std::vector<char> in_;  // raw bytes not yet decoded: [in_pos_, in_end_)
  size_t in_pos_ = 0, in_end_ = 0;
  bool raw_eof_ = false, eof_ = false;
  int64_t max_line_;
  int64_t file_bytes_ = 0, consumed_ = 0, decoded_ = 0;
  int64_t next_line_ = 1;
  int64_t raw_left_ = -1;      // bytes the range still allows read(2) to return; -1: no range
  std::string carry_;          // a partial line read past the last block's end
  std::string pending_error_;  // a read error held back until the lines before it are out
  std::string fill_error_;     // a decode error held back until the bytes before it are out
  LineBlock line_block_;       // read_line's current block
  size_t line_pos_ = 0;
  int64_t line_index_ = 0;  // of the next line within line_block_
};

// Why a line gave no text.
enum class RecordStatus { Ok, InvalidJson, MissingKey, NotString, InvalidUtf8 };
const char* record_status_name(RecordStatus s);  // "invalid JSON", "missing key", ...

// Pulls one top-level string field out of JSON object lines with simdjson
// (which validates the whole line, UTF-8 included, and unescapes \uXXXX and
// surrogate pairs). One per thread; the text view lives until the next call.
class JsonFieldReader {
 public:
  explicit JsonFieldReader(std::string key);
  ~JsonFieldReader();
  JsonFieldReader(const JsonFieldReader&) = delete;
  JsonFieldReader& operator=(const JsonFieldReader&) = delete;

  // `line` must be followed by kJsonPadding readable bytes. On failure `why`
  // says what is wrong (with a byte offset for invalid UTF-8).
  RecordStatus read(std::string_view line, std::string_view& text, std::string& why);
  const std::string& key() const { return key_; }

 private:
  std::string key_;
  struct Parser;
  std::unique_ptr<Parser> parser_;
};

}  // namespace nk
