// WARC files (ISO 28500, WARC/1.0 and WARC/1.1): a streaming record reader,
// and the HTTP response inside a `response` record.
//
// A file is plain, or gzip: either one member per record (Common Crawl's
// .warc.gz, what the standard recommends) or one member for the whole file;
// any mix of members is read, member after member, whatever the file's name.
// Memory is bounded by the largest block read (blocks skipped are decoded
// and dropped as they come), never the file.
//
// Damage is reported, never fatal: a record whose header is not a WARC
// header, lacks a valid Content-Length or is cut short, a gzip member whose
// data is corrupt or truncated, and bytes that are neither WARC nor gzip each
// give one Corrupt result naming the file and byte offset; the reader then
// resynchronises at the next record ("WARC/" at a line start, or the next
// gzip member) and goes on.
//
// Where a record is: "FILE@N", N the byte offset of the record in a plain
// file or of the gzip member that starts with it, or "FILE@N+K" for a record
// K bytes into the decompressed data of the member at N (a whole-file gzip).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nk::curate {

struct WarcHeader {
  std::string version;  // "WARC/1.0", "WARC/1.1"
  // Fields by name, as written (names compare case-insensitively in get()).
  std::vector<std::pair<std::string, std::string>> fields;
  int64_t content_length = 0;
  std::string where;  // "FILE@N" or "FILE@N+K", see above

  // A field's value ("" if absent); the first of repeated fields.
  std::string get(std::string_view name) const;
  std::string type() const { return get("WARC-Type"); }
  // WARC-Target-URI without the angle brackets some WARC/1.0 writers put
  // around it; WARC-Record-ID likewise ("urn:uuid:...").
  std::string target_uri() const;
  std::string record_id() const;
};

class WarcReader {
 public:
  // Opens `path`; nk::Error naming it when it cannot be opened or read (a
  // read error later is an nk::Error too: the file, not a record, is bad).
  explicit WarcReader(const std::string& path);
  ~WarcReader();
  WarcReader(const WarcReader&) = delete;
  WarcReader& operator=(const WarcReader&) = delete;

  enum class Next { Record, Corrupt, End };
  // The next record's header (Record); or damage (Corrupt: `error` says what,
  // `where` where); or End. A block neither read nor skipped is skipped first
  // (damage found in it is then reported, with its record's `where`).
  Next next(WarcHeader& h, std::string& error, std::string& where);

  // The first bytes of the current block, at most n: fewer at the block's end
  // or where damage cuts it short. Valid until the next call.
  std::string_view peek_block(size_t n);
  // The whole block into `out`; false when damage cuts it short (`error`
  // says how; the reader has moved past it).
  bool read_block(std::string& out, std::string& error);
  // Moves past the block without keeping it; false as read_block.
  bool skip_block(std::string& error);

  bool gzip() const { return gzip_; }
  int64_t bytes_consumed() const;  // of the file (compressed for gzip)
  const std::string& path() const { return path_; }

 private:
  struct Mark {
    int64_t dec = 0, comp = 0;  // decompressed offset, file offset of the member
  };
  struct Break {
    int64_t dec = 0, comp = 0;  // where the data is discontinuous; the damaged member
    std::string why;
    bool reported = false;
  };
  int64_t end() const { return buf_start_ + int64_t(buf_.size()); }
  void fill(int64_t want_end);  // decodes until `want_end` is buffered or the data ends
  void decode_more();
  bool refill_input();  // more file bytes after the unused ones; false at the file's end
  bool seek_gzip_magic(bool& all_zero);
  void add_break(int64_t comp, std::string why);
  Break* break_in(int64_t after, int64_t before);  // first unreported one in (after, before)
  std::string where_of(int64_t dec) const;
  bool block_damaged(int64_t upto, std::string& error);  // damage in (record start, upto)
  int64_t check_end();  // how far damage belongs to the current record, once its block is in

  std::string path_, shown_;  // shown_: the path as messages write it
  int fd_ = -1;
  bool gzip_ = false;
  struct Zlib;
  std::unique_ptr<Zlib> z_;
  std::vector<unsigned char> in_;  // compressed bytes [in_pos_, in_end_) not yet used
  size_t in_pos_ = 0, in_end_ = 0;
  int64_t in_off_ = 0;  // file offset of in_[0]
  bool raw_eof_ = false;
  bool member_open_ = false, resyncing_ = false;
  int64_t member_comp_ = 0;
  int64_t plain_read_ = 0;

  std::string buf_;        // decompressed bytes from buf_start_
  int64_t buf_start_ = 0;  // decompressed offset of buf_[0]
  bool eof_ = false;       // no more decompressed bytes will come
  std::vector<Mark> members_;
  std::vector<Break> breaks_;
  int64_t pos_ = 0;        // where parsing stands
  bool skipping_ = false;  // after damage: looking for the next record start

  bool in_record_ = false;  // a header was returned and its block not yet used
  int64_t record_start_ = 0, block_start_ = 0, block_end_ = 0;
  std::string record_where_;
};

// The status line and header fields at the start of a response record's block.
struct HttpResponse {
  int status = 0;
  std::string content_type, transfer_encoding, content_encoding;
  size_t body_offset = 0;  // where the body starts in the block
};
// False when `head` does not start with an HTTP status line and complete
// header fields.
bool parse_http_head(std::string_view head, HttpResponse& r);

// The body as the server meant it: chunked transfer coding removed, and a
// gzip or deflate content coding undone (up to max_bytes). False with `error`
// for a body that does not decode, or an unsupported coding ("br", ...).
bool decode_http_body(std::string_view body, const HttpResponse& r, std::string& out,
                      std::string& error, size_t max_bytes = size_t(64) << 20);

}  // namespace nk::curate
