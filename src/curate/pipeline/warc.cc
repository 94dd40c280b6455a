#include "curate/pipeline/warc.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"
#include "data/utf8.h"

namespace nk::curate {

namespace {

constexpr size_t kReadChunk = size_t(1) << 20;     // compressed bytes asked of read(2)
constexpr size_t kOutChunk = size_t(256) << 10;    // decompressed bytes per inflate call
constexpr int64_t kMaxHeader = int64_t(64) << 10;  // a longer WARC header is damage
constexpr int64_t kMaxContentLength = int64_t(1) << 50;

char lower(char c) {
  return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c;
}

bool ieq(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (lower(a[i]) != lower(b[i])) return false;
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

std::string strip_brackets(std::string s) {
  if (s.size() >= 2 && s.front() == '<' && s.back() == '>') return s.substr(1, s.size() - 2);
  return s;
}

// Header fields "Name: value" one per line (CRLF or LF), a line that starts
// with a space or tab continuing the previous value. False for a line that is
// neither.
bool parse_fields(std::string_view text, std::vector<std::pair<std::string, std::string>>& out,
                  std::string* bad_line) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    if (line.front() == ' ' || line.front() == '\t') {
      if (out.empty()) {
        if (bad_line) *bad_line = std::string(line);
        return false;
      }
      out.back().second += ' ';
      out.back().second += trim(line);
      continue;
    }
    size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) {
      if (bad_line) *bad_line = std::string(line);
      return false;
    }
    out.emplace_back(std::string(trim(line.substr(0, colon))),
                     std::string(trim(line.substr(colon + 1))));
  }
  return true;
}

// The first bytes of `s`, printable, for messages.
std::string quote_start(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 24)) {
    auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7F)
      out += c;
    else
      out += fmt::format("\\x{:02x}", u);
  }
  return out;
}

}  // namespace

std::string WarcHeader::get(std::string_view name) const {
  for (const auto& [k, v] : fields)
    if (ieq(k, name)) return v;
  return {};
}

std::string WarcHeader::target_uri() const {
  return strip_brackets(get("WARC-Target-URI"));
}

std::string WarcHeader::record_id() const {
  return strip_brackets(get("WARC-Record-ID"));
}

struct WarcReader::Zlib {
  z_stream s{};
  bool init = false;
  ~Zlib() {
    if (init) inflateEnd(&s);
  }
};

WarcReader::WarcReader(const std::string& path)
    : path_(path), shown_(escape_invalid_utf8(path)), z_(std::make_unique<Zlib>()) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail("{}: cannot open: {}", shown_, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || S_ISDIR(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    fail("{}: is a folder, not a WARC file", shown_);
  }
  in_.resize(kReadChunk);
  refill_input();
  const unsigned char* b = in_.data();
  if (in_end_ >= 2 && b[0] == 0x1F && b[1] == 0x8B) {
    gzip_ = true;
    if (inflateInit2(&z_->s, 15 + 16) != Z_OK) fail("{}: zlib: cannot start inflate", shown_);
    z_->init = true;
  } else if (in_end_ >= 4 && b[0] == 0x28 && b[1] == 0xB5 && b[2] == 0x2F && b[3] == 0xFD) {
    ::close(fd_);
    fd_ = -1;
    fail("{}: zstd-compressed WARC is not supported; use plain or gzip (one member per record)",
         shown_);
  }
}

WarcReader::~WarcReader() {
  if (fd_ >= 0) ::close(fd_);
}

int64_t WarcReader::bytes_consumed() const {
  return gzip_ ? in_off_ + int64_t(in_pos_) : plain_read_ - int64_t(in_end_ - in_pos_);
}

bool WarcReader::refill_input() {
  if (raw_eof_) return false;
  // Keep the unused bytes, at the front.
  if (in_pos_ > 0) {
    std::memmove(in_.data(), in_.data() + in_pos_, in_end_ - in_pos_);
    in_off_ += int64_t(in_pos_);
    in_end_ -= in_pos_;
    in_pos_ = 0;
  }
  bool got = false;
  while (in_end_ < in_.size()) {
    ssize_t n = ::read(fd_, in_.data() + in_end_, in_.size() - in_end_);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      fail("{}: read error after {} bytes: {}", shown_, in_off_ + int64_t(in_end_),
           std::strerror(errno));
    if (n == 0) {
      raw_eof_ = true;
      break;
    }
    in_end_ += size_t(n);
    plain_read_ += n;
    got = true;
    break;  // one read per call: keeps the reader streaming
  }
  return got;
}

bool WarcReader::seek_gzip_magic(bool& all_zero) {
  for (;;) {
    while (in_end_ - in_pos_ >= 3) {
      const unsigned char* p = in_.data() + in_pos_;
      if (p[0] == 0x1F && p[1] == 0x8B && p[2] == 0x08) return true;
      if (p[0] != 0) all_zero = false;
      ++in_pos_;
    }
    if (!refill_input()) {
      for (; in_pos_ < in_end_; ++in_pos_)
        if (in_[in_pos_] != 0) all_zero = false;
      return false;
    }
  }
}

void WarcReader::add_break(int64_t comp, std::string why) {
  if (!breaks_.empty() && !breaks_.back().reported && breaks_.back().dec == end()) return;
  Break b;
  b.dec = end();
  b.comp = comp;
  b.why = std::move(why);
  breaks_.push_back(std::move(b));
}

void WarcReader::decode_more() {
  if (!gzip_) {
    if (in_pos_ < in_end_) {
      buf_.append(reinterpret_cast<const char*>(in_.data()) + in_pos_, in_end_ - in_pos_);
      in_pos_ = in_end_;
      return;
    }
    size_t old = buf_.size();
    buf_.resize(old + kReadChunk);
    ssize_t n;
    do {
      n = ::read(fd_, buf_.data() + old, kReadChunk);
    } while (n < 0 && errno == EINTR);
    if (n < 0) fail("{}: read error after {} bytes: {}", shown_, plain_read_, std::strerror(errno));
    buf_.resize(old + size_t(n));
    plain_read_ += n;
    if (n == 0) eof_ = true;
    return;
  }
  z_stream& z = z_->s;
  if (!member_open_) {
    // A member boundary: the next member's magic, or bytes that are not gzip.
    if (in_end_ - in_pos_ < 3) refill_input();
    if (in_pos_ == in_end_) {
      eof_ = true;
      return;
    }
    const unsigned char* p = in_.data() + in_pos_;
    if (!(in_end_ - in_pos_ >= 3 && p[0] == 0x1F && p[1] == 0x8B && p[2] == 0x08)) {
      const int64_t at = in_off_ + int64_t(in_pos_);
      bool zeros = true;
      bool found = seek_gzip_magic(zeros);
      const int64_t n = in_off_ + int64_t(in_pos_) - at;
      // Zero padding after the last member is harmless; bytes after damage
      // already reported are part of it.
      if (!resyncing_ && !zeros)
        add_break(at, fmt::format("{} bytes at offset {} are not gzip data", n, at));
      if (!found) {
        eof_ = true;
        return;
      }
    }
    resyncing_ = false;
    member_comp_ = in_off_ + int64_t(in_pos_);
    members_.push_back({end(), member_comp_});
    inflateReset(&z);
    member_open_ = true;
  }
  if (in_pos_ == in_end_ && !refill_input()) {
    add_break(
        member_comp_,
        fmt::format("truncated gzip member at offset {}: the file ends inside it", member_comp_));
    member_open_ = false;
    eof_ = true;
    return;
  }
  z.next_in = in_.data() + in_pos_;
  z.avail_in = uInt(in_end_ - in_pos_);
  const size_t old = buf_.size();
  buf_.resize(old + kOutChunk);
  z.next_out = reinterpret_cast<Bytef*>(buf_.data() + old);
  z.avail_out = uInt(kOutChunk);
  const int ret = inflate(&z, Z_NO_FLUSH);
  const size_t produced = kOutChunk - z.avail_out;
  const size_t used = (in_end_ - in_pos_) - z.avail_in;
  buf_.resize(old + produced);
  in_pos_ += used;
  if (ret == Z_STREAM_END) {
    member_open_ = false;
    return;
  }
  if (ret == Z_OK || (ret == Z_BUF_ERROR && (produced > 0 || used > 0 || in_pos_ == in_end_)))
    return;
  add_break(member_comp_, fmt::format("corrupt gzip data in the member at offset {}: {}",
                                      member_comp_, z.msg ? z.msg : "no progress"));
  member_open_ = false;
  resyncing_ = true;
  // The next member may start anywhere after this one's start (inflate may
  // have read into it): search from there, as far back as the buffer holds.
  const int64_t from = std::max(member_comp_ + 1, in_off_);
  in_pos_ = size_t(from - in_off_);
}

void WarcReader::fill(int64_t want_end) {
  while (end() < want_end && !eof_) {
    // Drop what parsing has passed, once it is a good share of the buffer.
    const int64_t passed = std::min(pos_ - buf_start_, int64_t(buf_.size()));
    if (passed >= int64_t(1) << 20 && passed * 2 >= int64_t(buf_.size())) {
      buf_.erase(0, size_t(passed));
      buf_start_ += passed;
    }
    decode_more();
  }
}

WarcReader::Break* WarcReader::break_in(int64_t after, int64_t before) {
  for (Break& b : breaks_)
    if (!b.reported && b.dec > after && b.dec < before) return &b;
  return nullptr;
}

std::string WarcReader::where_of(int64_t dec) const {
  if (!gzip_) return fmt::format("{}@{}", shown_, dec);
  const Mark* m = nullptr;
  for (const Mark& x : members_)
    if (x.dec <= dec) m = &x;
  if (!m) return fmt::format("{}@0+{}", shown_, dec);
  if (m->dec == dec) return fmt::format("{}@{}", shown_, m->comp);
  return fmt::format("{}@{}+{}", shown_, m->comp, dec - m->dec);
}

WarcReader::Next WarcReader::next(WarcHeader& h, std::string& error, std::string& where) {
  if (in_record_ && !skip_block(error)) {
    where = record_where_;
    return Next::Corrupt;
  }
  in_record_ = false;
  for (;;) {
    fill(pos_ + 1);
    // Damage at this point: reported, unless it belongs to damage already
    // reported (while looking for the next record). Data after it starts a
    // new gzip member.
    for (Break& b : breaks_) {
      if (b.reported || b.dec > pos_) continue;
      b.reported = true;
      const bool quiet = skipping_;
      skipping_ = false;
      if (quiet) continue;
      error = b.why;
      where = fmt::format("{}@{}", shown_, b.comp);
      return Next::Corrupt;
    }
    breaks_.erase(std::remove_if(breaks_.begin(), breaks_.end(),
                                 [&](const Break& b) { return b.reported && b.dec <= pos_; }),
                  breaks_.end());
    // Marks of members before the one holding pos_ are no longer needed.
    size_t keep = 0;
    while (keep + 1 < members_.size() && members_[keep + 1].dec <= pos_) ++keep;
    members_.erase(members_.begin(), members_.begin() + std::ptrdiff_t(keep));
    if (end() <= pos_) return Next::End;

    const char c = buf_[size_t(pos_ - buf_start_)];
    if (c == '\r' || c == '\n') {  // the blank lines that end a record
      ++pos_;
      continue;
    }
    int64_t limit = std::numeric_limits<int64_t>::max();
    for (const Break& b : breaks_)
      if (!b.reported && b.dec > pos_) limit = std::min(limit, b.dec);

    if (skipping_) {
      // After damage: the next "WARC/" at a line start or a member start.
      for (;;) {
        const int64_t stop = std::min(end(), limit);
        const char* b0 = buf_.data();
        const int64_t o = buf_start_;  // b0[abs - o] is the byte at offset abs
        for (int64_t q = pos_ + 1; q + 5 <= stop; ++q) {
          const void* w = std::memchr(b0 + (q - o), 'W', size_t(stop - 4 - q));
          if (!w) break;
          q = (static_cast<const char*>(w) - b0) + o;
          if (std::memcmp(b0 + (q - o), "WARC/", 5) != 0) continue;
          bool member_start = false;
          for (const Mark& m : members_) member_start |= m.dec == q;
          if (b0[q - 1 - o] == '\n' || member_start) {
            pos_ = q;
            skipping_ = false;
            break;
          }
        }
        if (!skipping_ || stop == limit) {
          if (skipping_) pos_ = limit;
          break;
        }
        if (eof_) {
          pos_ = end();
          break;
        }
        pos_ = std::max(pos_, stop - 5);
        fill(end() + 1);
      }
      continue;
    }

    // A header: "WARC/x.y" and fields, up to a blank line.
    const int64_t start = pos_;
    where = where_of(start);
    fill(start + 5);
    auto at = [&](int64_t abs) { return buf_.data() + (abs - buf_start_); };
    const int64_t have = std::min(end(), limit) - start;
    if (have < 5 || std::memcmp(at(start), "WARC/", 5) != 0) {
      error =
          have < 5
              ? "truncated record: the data ends at its start"
              : fmt::format(
                    "not a WARC record: expected 'WARC/1.0' or 'WARC/1.1', found '{}'",
                    quote_start(std::string_view(at(start), size_t(std::min<int64_t>(have, 24)))));
      skipping_ = true;
      return Next::Corrupt;
    }
    int64_t hend = -1, scanned = start;
    for (;;) {
      const int64_t stop = std::min({end(), limit, start + kMaxHeader});
      std::string_view s(at(start), size_t(stop - start));
      size_t from = size_t(std::max<int64_t>(0, scanned - start - 3));
      size_t crlf = s.find("\r\n\r\n", from), lf = s.find("\n\n", from);
      if (crlf != std::string_view::npos && (lf == std::string_view::npos || crlf + 2 <= lf)) {
        hend = start + int64_t(crlf) + 4;
        break;
      }
      if (lf != std::string_view::npos) {
        hend = start + int64_t(lf) + 2;
        break;
      }
      if (stop == start + kMaxHeader) {
        error = fmt::format("WARC header longer than {} KiB", kMaxHeader >> 10);
        skipping_ = true;
        return Next::Corrupt;
      }
      if (stop == limit || eof_) {
        Break* b = stop == limit ? break_in(start, limit + 1) : nullptr;
        if (b) {
          b->reported = true;
          error = "truncated record header: " + b->why;
          pos_ = b->dec;
        } else {
          error = "truncated record: the file ends inside its header";
          pos_ = end();
        }
        return Next::Corrupt;
      }
      scanned = stop;
      fill(end() + 1);
    }
    std::string_view head(at(start), size_t(hend - start));
    size_t eol = head.find('\n');
    std::string_view version = trim(head.substr(0, eol));
    h = WarcHeader{};
    h.where = where;
    bool version_ok = version.size() >= 8 && version.size() <= 12;
    for (size_t i = 5; version_ok && i < version.size(); ++i)
      version_ok = (version[i] >= '0' && version[i] <= '9') || version[i] == '.';
    std::string bad_line;
    if (!version_ok) {
      error = fmt::format("not a WARC record: bad version line '{}'", quote_start(version));
      skipping_ = true;
      return Next::Corrupt;
    }
    h.version = std::string(version);
    if (!parse_fields(head.substr(eol + 1), h.fields, &bad_line)) {
      error = fmt::format("malformed WARC header line '{}'", quote_start(bad_line));
      skipping_ = true;
      return Next::Corrupt;
    }
    std::string len = h.get("Content-Length");
    bool len_ok = !len.empty() && len.size() <= 16;
    int64_t n = 0;
    for (char d : len) {
      len_ok = len_ok && d >= '0' && d <= '9';
      if (len_ok) n = n * 10 + (d - '0');
    }
    if (!len_ok || n > kMaxContentLength) {
      error = len.empty() ? "WARC header has no Content-Length"
                          : fmt::format("invalid Content-Length '{}'", quote_start(len));
      skipping_ = true;
      return Next::Corrupt;
    }
    h.content_length = n;
    record_start_ = start;
    block_start_ = hend;
    block_end_ = hend + n;
    record_where_ = where;
    in_record_ = true;
    pos_ = block_start_;
    return Next::Record;
  }
}

bool WarcReader::block_damaged(int64_t upto, std::string& error) {
  Break* b = break_in(record_start_, upto);
  if (!b) return false;
  b->reported = true;
  error = "damaged record: " + b->why;
  pos_ = b->dec;
  skipping_ = false;
  return true;
}

std::string_view WarcReader::peek_block(size_t n) {
  if (!in_record_) return {};
  const int64_t want = std::min(block_end_, block_start_ + int64_t(n));
  fill(want);
  int64_t stop = std::min(want, end());
  for (const Break& b : breaks_)
    if (!b.reported && b.dec > record_start_ && b.dec < stop) stop = b.dec;
  return std::string_view(buf_.data() + (block_start_ - buf_start_),
                          size_t(std::max<int64_t>(0, stop - block_start_)));
}

// A record in a gzip member of its own (Common Crawl's layout) is checked by
// the member's CRC and length, read just after it: see the member to its end,
// so that damage there drops the record rather than only being counted.
int64_t WarcReader::check_end() {
  bool own_member = false;
  for (const Mark& m : members_) own_member |= gzip_ && m.dec == record_start_;
  if (!own_member) return block_end_;
  while (member_open_ && !eof_ && end() <= block_end_ + 4) decode_more();
  if (end() >= block_end_ + 4 &&
      std::memcmp(buf_.data() + (block_end_ - buf_start_), "\r\n\r\n", 4) == 0)
    return block_end_ + 5;
  // The blank lines that end a record are not there: damaged data decoded
  // into garbage (or a sloppy writer). Damage anywhere in the member, up to a
  // little past the record, is this record's.
  auto member_end = [&] {
    for (const Mark& m : members_)
      if (m.dec > record_start_) return m.dec;
    return int64_t(-1);
  };
  while (member_end() < 0 && member_open_ && !eof_ && end() < block_end_ + (int64_t(64) << 10))
    decode_more();
  return (member_end() < 0 ? end() : member_end()) + 1;
}

bool WarcReader::read_block(std::string& out, std::string& error) {
  if (!in_record_) return false;
  in_record_ = false;
  fill(block_end_);
  if (block_damaged(end() >= block_end_ ? check_end() : block_end_, error)) return false;
  if (end() < block_end_) {
    error =
        fmt::format("truncated record: Content-Length {} but the file ends {} bytes into the block",
                    block_end_ - block_start_, end() - block_start_);
    pos_ = end();
    return false;
  }
  out.assign(buf_.data() + (block_start_ - buf_start_), size_t(block_end_ - block_start_));
  pos_ = block_end_;
  return true;
}

bool WarcReader::skip_block(std::string& error) {
  if (!in_record_) return true;
  in_record_ = false;
  for (;;) {
    fill(std::min(block_end_, pos_ + (int64_t(4) << 20)));
    if (block_damaged(block_end_, error)) return false;
    pos_ = std::min(block_end_, end());
    if (pos_ == block_end_) return !block_damaged(check_end(), error);
    if (eof_) {
      error = fmt::format(
          "truncated record: Content-Length {} but the file ends {} bytes into the block",
          block_end_ - block_start_, end() - block_start_);
      return false;
    }
  }
}

// ---------------------------------------------------------------------------
// HTTP

bool parse_http_head(std::string_view head, HttpResponse& r) {
  r = HttpResponse{};
  if (head.size() < 12 || head.compare(0, 5, "HTTP/") != 0) return false;
  size_t crlf = head.find("\r\n\r\n"), lf = head.find("\n\n");
  size_t end;
  if (crlf != std::string_view::npos && (lf == std::string_view::npos || crlf + 2 <= lf)) {
    end = crlf + 4;
  } else if (lf != std::string_view::npos) {
    end = lf + 2;
  } else {
    return false;
  }
  size_t eol = head.find('\n');
  std::string_view status = head.substr(0, eol);
  size_t sp = status.find(' ');
  if (sp == std::string_view::npos || sp + 4 > status.size()) return false;
  int code = 0;
  for (size_t i = sp + 1; i < sp + 4; ++i) {
    if (status[i] < '0' || status[i] > '9') return false;
    code = code * 10 + (status[i] - '0');
  }
  r.status = code;
  std::vector<std::pair<std::string, std::string>> fields;
  // Servers send all sorts of lines: one that is not a field is passed over.
  size_t pos = eol + 1;
  while (pos < end) {
    size_t nl = head.find('\n', pos);
    if (nl == std::string_view::npos || nl > end) nl = end;
    std::string_view line = trim(head.substr(pos, nl - pos));
    pos = nl + 1;
    size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) continue;
    std::string_view name = trim(line.substr(0, colon)), value = trim(line.substr(colon + 1));
    auto set = [&](std::string& f) {
      if (f.empty()) {
        f = std::string(value);
        for (char& c : f) c = lower(c);
      }
    };
    if (ieq(name, "Content-Type")) {
      if (r.content_type.empty()) r.content_type = std::string(value);
    } else if (ieq(name, "Transfer-Encoding")) {
      set(r.transfer_encoding);
    } else if (ieq(name, "Content-Encoding")) {
      set(r.content_encoding);
    }
  }
  r.body_offset = end;
  return true;
}

namespace {

bool dechunk(std::string_view in, std::string& out, std::string& error) {
  out.clear();
  size_t pos = 0;
  for (;;) {
    size_t eol = in.find('\n', pos);
    if (eol == std::string_view::npos) {
      // A crawler may cut the body short: keep what came.
      if (!out.empty()) return true;
      error = "malformed chunked body: no chunk size";
      return false;
    }
    std::string_view line = trim(in.substr(pos, eol - pos));
    line = line.substr(0, line.find(';'));
    uint64_t n = 0;
    if (line.empty() || line.size() > 15) {
      error = fmt::format("malformed chunked body: chunk size '{}'", quote_start(line));
      return false;
    }
    for (char c : line) {
      int d = (c >= '0' && c <= '9')   ? c - '0'
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                       : -1;
      if (d < 0) {
        error = fmt::format("malformed chunked body: chunk size '{}'", quote_start(line));
        return false;
      }
      n = n * 16 + uint64_t(d);
    }
    pos = eol + 1;
    if (n == 0) return true;
    if (n > in.size() - pos) {
      out.append(in.substr(pos));  // truncated by the crawler
      return true;
    }
    out.append(in.substr(pos, n));
    pos += n;
    if (pos < in.size() && in[pos] == '\r') ++pos;
    if (pos < in.size() && in[pos] == '\n') ++pos;
  }
}

bool inflate_body(std::string_view in, int window_bits, size_t max_bytes, std::string& out,
                  std::string& error) {
  z_stream z{};
  if (inflateInit2(&z, window_bits) != Z_OK) {
    error = "zlib: cannot start inflate";
    return false;
  }
  out.clear();
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = uInt(in.size());
  int ret = Z_OK;
  while (ret == Z_OK) {
    size_t old = out.size();
    if (old >= max_bytes) {
      inflateEnd(&z);
      error = fmt::format("decoded body larger than {} MiB", max_bytes >> 20);
      return false;
    }
    out.resize(old + kOutChunk);
    z.next_out = reinterpret_cast<Bytef*>(out.data() + old);
    z.avail_out = uInt(kOutChunk);
    ret = inflate(&z, Z_NO_FLUSH);
    out.resize(old + kOutChunk - z.avail_out);
    if (ret == Z_BUF_ERROR && z.avail_in == 0) break;  // truncated: keep what came
  }
  const char* msg = z.msg;
  inflateEnd(&z);
  if (ret == Z_OK || ret == Z_STREAM_END || ret == Z_BUF_ERROR) return true;
  error = fmt::format("corrupt compressed body: {}", msg ? msg : "zlib error");
  return false;
}

}  // namespace

bool decode_http_body(std::string_view body, const HttpResponse& r, std::string& out,
                      std::string& error, size_t max_bytes) {
  std::string dechunked;
  if (r.transfer_encoding.find("chunked") != std::string::npos) {
    if (!dechunk(body, dechunked, error)) return false;
    body = dechunked;
  }
  const std::string& ce = r.content_encoding;
  if (ce.empty() || ce == "identity" || ce == "none") {
    out = dechunked.empty() ? std::string(body) : std::move(dechunked);
    return true;
  }
  if (ce == "gzip" || ce == "x-gzip") return inflate_body(body, 15 + 32, max_bytes, out, error);
  if (ce == "deflate") {
    // zlib-wrapped as the standard says, or raw deflate as some servers send.
    if (inflate_body(body, 15, max_bytes, out, error)) return true;
    return inflate_body(body, -15, max_bytes, out, error);
  }
  error = fmt::format("unsupported Content-Encoding '{}'", ce);
  return false;
}

}  // namespace nk::curate
