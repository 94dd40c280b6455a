#include "data/jsonl_reader.h"

#include <fcntl.h>
#include <simdjson.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "data/dataset/text_dataset.h"

namespace nk {

static_assert(kJsonPadding >= simdjson::SIMDJSON_PADDING);

namespace {
constexpr size_t kReadChunk = size_t(1) << 20;  // bytes asked of read(2) / zstd per call
}  // namespace

struct JsonlReader::ZstdState {
  ZSTD_DStream* ds = ZSTD_createDStream();
  bool frame_open = false;  // the last call ended inside a frame
  ~ZstdState() { ZSTD_freeDStream(ds); }
};

JsonlReader::JsonlReader(const std::string& path, int64_t max_line_bytes)
    : path_(path), max_line_(max_line_bytes) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st;
  if (::fstat(fd_, &st) != 0) {
    int e = errno;
    ::close(fd_);
    fail("{}: cannot stat: {}", path, std::strerror(e));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd_);
    fail("{}: is a folder, not a JSONL file", path);
  }
  if (S_ISREG(st.st_mode)) file_bytes_ = int64_t(st.st_size);
  in_.resize(ZSTD_DStreamInSize());
  // Sniff the magic bytes; they stay in in_ for fill() to hand on.
  while (in_end_ < 4 && !raw_eof_) {
    size_t n = read_raw(in_.data() + in_end_, in_.size() - in_end_);
    if (n == 0) raw_eof_ = true;
    in_end_ += n;
  }
  auto b = reinterpret_cast<const unsigned char*>(in_.data());
  bool zstd_frame = in_end_ >= 4 && b[0] == 0x28 && b[1] == 0xB5 && b[2] == 0x2F && b[3] == 0xFD;
  bool skippable =
      in_end_ >= 4 && (b[0] & 0xF0) == 0x50 && b[1] == 0x2A && b[2] == 0x4D && b[3] == 0x18;
  if (in_end_ >= 2 && b[0] == 0x1F && b[1] == 0x8B) {
    ::close(fd_);
    fail("{}: gzip-compressed input is not supported; decompress it or recompress with zstd", path);
  }
  if (zstd_frame || skippable) {
    zstd_ = true;
    zs_ = std::make_unique<ZstdState>();
  }
}

JsonlReader::~JsonlReader() {
  if (fd_ >= 0) ::close(fd_);
}

void JsonlReader::restrict_to(int64_t offset, int64_t length, int64_t first_line) {
  NK_CHECK(!zstd_ && consumed_ == 0 && decoded_ == 0, "{}: restrict_to on a zstd or started file",
           path_);
  if (::lseek(fd_, off_t(offset), SEEK_SET) < 0)
    fail("{}: cannot seek to byte {}: {}", path_, offset, std::strerror(errno));
  in_pos_ = in_end_ = 0;  // the sniffed bytes were the file's start
  raw_eof_ = false;
  raw_left_ = length;
  next_line_ = first_line;
}

size_t JsonlReader::read_raw(char* dst, size_t cap) {
  if (raw_left_ >= 0) cap = std::min(cap, size_t(raw_left_));
  if (cap == 0) return 0;
  for (;;) {
    ssize_t n = ::read(fd_, dst, cap);
    if (n >= 0) {
      if (raw_left_ >= 0) raw_left_ -= n;
      return size_t(n);
    }
    if (errno == EINTR) continue;
    fail("{}: read error after {} bytes: {}", path_, consumed_, std::strerror(errno));
  }
}

size_t JsonlReader::fill(char* dst, size_t cap) {
  size_t got = 0;
  if (!zstd_) {
    if (in_pos_ < in_end_) {  // the sniffed prefix first
      got = std::min(cap, in_end_ - in_pos_);
      std::memcpy(dst, in_.data() + in_pos_, got);
      in_pos_ += got;
    } else if (!raw_eof_) {
      got = read_raw(dst, cap);
      if (got == 0) raw_eof_ = true;
    }
    consumed_ += int64_t(got);
    decoded_ += int64_t(got);
    return got;
  }
  if (!fill_error_.empty()) throw Error(fill_error_);
  ZSTD_outBuffer out{dst, cap, 0};
  while (out.pos < out.size) {
    if (in_pos_ == in_end_ && !raw_eof_) {
      in_pos_ = 0;
      in_end_ = read_raw(in_.data(), in_.size());
      if (in_end_ == 0) raw_eof_ = true;
    }
    size_t before = out.pos;
    ZSTD_inBuffer in{in_.data(), in_end_, in_pos_};
    size_t r = ZSTD_decompressStream(zs_->ds, &out, &in);
    bool moved = in.pos != in_pos_ || out.pos != before;
    consumed_ += int64_t(in.pos - in_pos_);
    in_pos_ = in.pos;
    if (ZSTD_isError(r)) {
      std::string msg = fmt::format("{}: corrupt zstd data near compressed byte offset {}: {}",
                                    path_, consumed_, ZSTD_getErrorName(r));
      if (out.pos == 0) throw Error(msg);
      fill_error_ = msg;  // the bytes decoded before it go out first
      break;
    }
    // r is 0 exactly when a frame is complete and flushed; a call that moved
    // nothing after the last frame says nothing about it.
    if (moved) zs_->frame_open = r != 0;
    if (in_pos_ == in_end_ && raw_eof_ && out.pos == before) break;  // nothing more to come
  }
  if (out.pos == 0 && zs_->frame_open)
    fail("{}: truncated zstd stream: the file ends inside a frame at compressed byte offset {}",
         path_, consumed_);
  decoded_ += int64_t(out.pos);
  return out.pos;
}

bool JsonlReader::read_block(LineBlock& block, size_t target_bytes) {
  if (!pending_error_.empty()) throw Error(pending_error_);
  std::string& b = block.bytes;
  size_t want = std::max<size_t>(target_bytes, 1);
  b.clear();
  // Room for the usual block (target, the carry, padding) in one allocation.
  b.reserve(want + carry_.size() + kReadChunk / 16 + kJsonPadding);
  b.append(carry_);
  block.first_line = next_line_;
  size_t line_start = 0;  // start of the line not ended yet (a carry holds no '\n')
  bool have_newline = false;
  while (!(have_newline && b.size() >= want) && !eof_) {
    size_t old = b.size();
    size_t chunk = want > old ? std::max(want - old, kReadChunk / 16) : kReadChunk;
    b.resize(old + chunk);
    size_t n;
    try {
      n = fill(b.data() + old, chunk);
    } catch (const Error& e) {
      int64_t line = next_line_ + std::count(b.data(), b.data() + old, '\n');
      std::string msg = fmt::format("{} (while reading line {})", e.what(), line);
      if (!have_newline) throw Error(msg);
      // Hand out the whole lines before the damage; the next call fails.
      pending_error_ = msg;
      b.resize(old);
      break;
    }
    b.resize(old + n);
    if (n == 0) {
      eof_ = true;
      break;
    }
    const void* last = ::memrchr(b.data() + old, '\n', n);
    if (last) {
      have_newline = true;
      line_start = size_t(static_cast<const char*>(last) - b.data()) + 1;
    }
    if (int64_t(b.size() - line_start) > max_line_) {
      int64_t line = next_line_ + std::count(b.data(), b.data() + line_start, '\n');
      fail("{}:{}: line longer than {} bytes (max_line_bytes)", path_, line, max_line_);
    }
  }
  carry_.clear();
  if (!eof_) {
    carry_.assign(b, line_start, std::string::npos);
    b.resize(line_start);
  } else if (!b.empty() && b.back() != '\n') {
    b.push_back('\n');
  }
  if (b.empty()) return false;
  block.size = b.size();
  block.num_lines = 0;
  for (const char *p = b.data(), *end = b.data() + b.size(); p < end; ++block.num_lines) {
    auto nl = static_cast<const char*>(std::memchr(p, '\n', size_t(end - p)));
    if (nl - p > max_line_)
      fail("{}:{}: line longer than {} bytes (max_line_bytes)", path_, next_line_ + block.num_lines,
           max_line_);
    p = nl + 1;
  }
  block.input_end = consumed_;
  next_line_ += block.num_lines;
  b.append(kJsonPadding, ' ');
  return true;
}

bool JsonlReader::read_line(std::string_view& line, int64_t& line_no) {
  if (line_pos_ >= line_block_.size) {
    if (!read_block(line_block_, kReadChunk)) return false;
    line_pos_ = 0;
    line_index_ = 0;
  }
  std::string_view rest = line_block_.lines().substr(line_pos_);
  size_t nl = rest.find('\n');  // every block line ends in '\n'
  line = rest.substr(0, nl);
  line_no = line_block_.first_line + line_index_++;
  line_pos_ += nl + 1;
  return true;
}

// ---------------------------------------------------------------------------

const char* record_status_name(RecordStatus s) {
  switch (s) {
    case RecordStatus::Ok:
      return "ok";
    case RecordStatus::InvalidJson:
      return "invalid JSON";
    case RecordStatus::MissingKey:
      return "missing key";
    case RecordStatus::NotString:
      return "not a string";
    case RecordStatus::InvalidUtf8:
      return "invalid UTF-8";
  }
  return "?";
}

struct JsonFieldReader::Parser {
  simdjson::dom::parser p;
};

JsonFieldReader::JsonFieldReader(std::string key)
    : key_(std::move(key)), parser_(std::make_unique<Parser>()) {}
JsonFieldReader::~JsonFieldReader() = default;

namespace {
const char* json_type_name(simdjson::dom::element_type t) {
  using T = simdjson::dom::element_type;
  switch (t) {
    case T::ARRAY:
      return "an array";
    case T::OBJECT:
      return "an object";
    case T::INT64:
    case T::UINT64:
    case T::DOUBLE:
      return "a number";
    case T::STRING:
      return "a string";
    case T::BOOL:
      return "a boolean";
    case T::NULL_VALUE:
      return "null";
  }
  return "?";
}
}  // namespace

RecordStatus JsonFieldReader::read(std::string_view line, std::string_view& text,
                                   std::string& why) {
  // A parser that grew for a huge line gives the memory back.
  constexpr size_t kKeepCapacity = size_t(64) << 20;
  if (parser_->p.capacity() > kKeepCapacity && line.size() < kKeepCapacity)
    parser_ = std::make_unique<Parser>();
  simdjson::dom::element doc;
  auto err = parser_->p.parse(line.data(), line.size(), false).get(doc);
  if (err == simdjson::UTF8_ERROR) {
    why = fmt::format("invalid UTF-8 at byte {} of the line", find_invalid_utf8(line));
    return RecordStatus::InvalidUtf8;
  }
  if (err == simdjson::STRING_ERROR) {
    why = "bad string escape (an unknown \\ escape or a lone \\uD800-\\uDFFF surrogate)";
    return RecordStatus::InvalidJson;
  }
  if (err == simdjson::UNESCAPED_CHARS) {
    why = "control character not escaped inside a string";
    return RecordStatus::InvalidJson;
  }
  if (err) {
    why = simdjson::error_message(err);
    return RecordStatus::InvalidJson;
  }
  if (!doc.is_object()) {
    why = fmt::format("the line is {}, not a JSON object", json_type_name(doc.type()));
    return RecordStatus::InvalidJson;
  }
  // A key given twice: the last wins (core/json.h), where at_key takes the first.
  simdjson::dom::element v;
  bool found = false;
  const simdjson::dom::object obj = doc.get_object().value_unsafe();
  for (auto field : obj)
    if (field.key == key_) v = field.value, found = true;
  if (!found) {
    why = fmt::format("no key \"{}\"", key_);
    return RecordStatus::MissingKey;
  }
  if (!v.is_string()) {
    why = fmt::format("\"{}\" is {}, not a string", key_, json_type_name(v.type()));
    return RecordStatus::NotString;
  }
  text = v.get_string().value_unsafe();
  return RecordStatus::Ok;
}

}  // namespace nk
