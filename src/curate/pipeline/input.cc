#include "curate/pipeline/input.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/parallel.h"
#include "curate/pipeline/charset.h"
#include "data/utf8.h"

namespace nk::curate {

namespace fs = std::filesystem;

const char* source_format_name(SourceFormat f) {
  switch (f) {
    case SourceFormat::Jsonl:
      return "jsonl";
    case SourceFormat::Text:
      return "text";
    case SourceFormat::Html:
      return "html";
    case SourceFormat::Latex:
      return "latex";
    case SourceFormat::Warc:
      return "warc";
    case SourceFormat::Wet:
      return "wet";
  }
  return "?";
}

namespace {

bool ends_with(const std::string& s, const char* suffix) {
  size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// The format of a file found by extension; false if unknown.
bool format_by_name(const std::string& path, SourceFormat& f) {
  std::string p = path;
  std::transform(p.begin(), p.end(), p.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* e : {".jsonl", ".json", ".jsonl.zst", ".json.zst", ".zst", ".ndjson"})
    if (ends_with(p, e)) return f = SourceFormat::Jsonl, true;
  for (const char* e : {".html", ".htm", ".xhtml"})
    if (ends_with(p, e)) return f = SourceFormat::Html, true;
  if (ends_with(p, ".tex")) return f = SourceFormat::Latex, true;
  for (const char* e : {".warc", ".warc.gz"})
    if (ends_with(p, e)) return f = SourceFormat::Warc, true;
  for (const char* e : {".wet", ".wet.gz"})
    if (ends_with(p, e)) return f = SourceFormat::Wet, true;
  for (const char* e : {".txt", ".text", ".md", ".rst"})
    if (ends_with(p, e)) return f = SourceFormat::Text, true;
  return false;
}

SourceFormat forced_format(const std::string& name) {
  if (name == "jsonl") return SourceFormat::Jsonl;
  if (name == "text") return SourceFormat::Text;
  if (name == "html") return SourceFormat::Html;
  if (name == "latex") return SourceFormat::Latex;
  if (name == "warc") return SourceFormat::Warc;
  if (name == "wet") return SourceFormat::Wet;
  fail("input.format: expected auto, jsonl, text, html, latex, warc or wet, got '{}'", name);
}

int64_t file_size_of(const std::string& path) {
  std::error_code ec;
  auto n = fs::file_size(path, ec);
  return ec ? 0 : int64_t(n);
}

// One shard for a JSONL file, or, for a plain file above `shard_bytes`,
// shards of about that size cut after a newline, with their first line
// numbers (one pass over the file, counting lines).
std::vector<Shard> split_jsonl(const std::string& path, int64_t shard_bytes) {
  Shard whole;
  whole.format = SourceFormat::Jsonl;
  whole.files.emplace_back(path, SourceFormat::Jsonl);
  whole.bytes = file_size_of(path);
  if (shard_bytes <= 0 || whole.bytes <= shard_bytes || JsonlReader(path).zstd()) return {whole};
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("input.paths: cannot read '{}'", path);
  std::vector<Shard> out;
  std::vector<char> buf(size_t(4) << 20);
  int64_t pos = 0, line = 1, start = 0, start_line = 1;
  auto cut = [&](int64_t end) {
    Shard s = whole;
    s.offset = start;
    s.bytes = end - start;
    s.first_line = start_line;
    out.push_back(std::move(s));
  };
  while (in.read(buf.data(), std::streamsize(buf.size())) || in.gcount() > 0) {
    size_t n = size_t(in.gcount());
    for (size_t i = 0; i < n; ++i) {
      if (buf[i] != '\n') continue;
      ++line;
      int64_t end = pos + int64_t(i) + 1;
      if (end - start >= shard_bytes && end < whole.bytes) {
        cut(end);
        start = end;
        start_line = line;
      }
    }
    pos += int64_t(n);
  }
  cut(pos);
  return out;
}

void skip_loop(const std::string& path, const std::string& why, std::vector<std::string>& loops) {
  NK_WARN("curate: skipped '{}': a symbolic link loop ({})", path, why);
  loops.push_back(path);
}

// A folder by identity, whatever path reached it.
struct FolderId {
  dev_t dev;
  ino_t ino;
  auto operator<=>(const FolderId&) const = default;
};

// Walks a folder for input files, following symbolic links. A link back into
// a folder on its own path (a loop) is skipped with a warning naming it, as
// is one leading to a folder already walked (its files would be read twice).
class FolderWalk {
 public:
  std::vector<std::string> found;  // regular files, and links to nothing
  std::vector<std::string> loops;  // the looping links skipped

  void walk(const fs::path& root) {
    struct stat st {};
    if (::stat(root.c_str(), &st) != 0 || !seen_.insert({st.st_dev, st.st_ino}).second) return;
    path_.push_back({{st.st_dev, st.st_ino}, root});
    walk_below(root);
    path_.pop_back();
  }

 private:
  void walk_below(const fs::path& dir) {
    std::error_code ec;
    fs::directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
    if (ec) fail("input.paths: cannot list '{}': {}", dir.string(), ec.message());
    // In name order, so that of two links to one folder the same one is read.
    std::vector<fs::path> entries;
    for (; it != fs::directory_iterator(); it.increment(ec)) {
      if (ec) fail("input.paths: cannot list '{}': {}", dir.string(), ec.message());
      entries.push_back(it->path());
    }
    std::sort(entries.begin(), entries.end());
    for (const fs::path& p : entries) {
      struct stat st {};
      if (::stat(p.c_str(), &st) != 0) {
        if (errno == ELOOP) {
          skip_loop(p.string(), "it resolves to itself", loops);
        } else if (fs::is_symlink(p, ec)) {
          // A link to nothing is listed so that reading it fails and is
          // counted, rather than vanishing silently.
          found.push_back(p.string());
        }
        continue;
      }
      if (S_ISREG(st.st_mode)) {
        found.push_back(p.string());
        continue;
      }
      if (!S_ISDIR(st.st_mode)) continue;
      const FolderId id{st.st_dev, st.st_ino};
      auto on_path =
          std::find_if(path_.begin(), path_.end(), [&](const auto& a) { return a.first == id; });
      if (on_path != path_.end()) {
        skip_loop(p.string(), fmt::format("it leads back to '{}'", on_path->second.string()),
                  loops);
        continue;
      }
      if (!seen_.insert(id).second) {
        NK_WARN("curate: skipped '{}': it leads to a folder already read", p.string());
        continue;
      }
      path_.push_back({id, p});
      walk_below(p);
      path_.pop_back();
    }
  }
  std::vector<std::pair<FolderId, fs::path>> path_;  // the folders walked into, root first
  std::set<FolderId> seen_;
};

}  // namespace

std::vector<Shard> plan_shards(const InputOptions& opt) {
  if (opt.paths.empty()) fail("input.paths: no input given (files or folders)");
  if (opt.shard_mb < 0) fail("input.shard_mb: must be >= 0, got {}", opt.shard_mb);
  if (opt.files_per_shard < 1)
    fail("input.files_per_shard: must be >= 1, got {}", opt.files_per_shard);
  if (opt.invalid_utf8 != "replace" && opt.invalid_utf8 != "skip")
    fail("input.invalid_utf8: expected replace or skip, got '{}'", opt.invalid_utf8);
  const bool autodetect = opt.format == "auto";
  const SourceFormat forced = autodetect ? SourceFormat::Text : forced_format(opt.format);

  std::vector<std::pair<std::string, SourceFormat>> files;
  int64_t skipped = 0;
  std::vector<std::string> loops;
  for (const std::string& p : opt.paths) {
    std::error_code ec;
    fs::file_status st = fs::status(p, ec);
    if (ec == std::errc::too_many_symbolic_link_levels) {
      skip_loop(p, "it resolves to itself", loops);
      continue;
    }
    if (ec || !fs::exists(st)) fail("input.paths: '{}' does not exist", p);
    if (fs::is_directory(st)) {
      FolderWalk walk;
      walk.walk(p);
      loops.insert(loops.end(), walk.loops.begin(), walk.loops.end());
      std::vector<std::string>& found = walk.found;
      std::sort(found.begin(), found.end());
      for (const std::string& f : found) {
        SourceFormat fmt = forced;
        if (autodetect && !format_by_name(f, fmt)) {
          ++skipped;
          continue;
        }
        files.emplace_back(f, fmt);
      }
    } else {
      SourceFormat fmt = forced;
      if (autodetect && !format_by_name(p, fmt)) fmt = SourceFormat::Text;
      files.emplace_back(p, fmt);
    }
  }
  if (skipped > 0)
    NK_WARN("curate: skipped {} files of unknown type in the input folders (set input.format)",
            skipped);
  if (files.empty() && !loops.empty())
    fail("input.paths: no input files found in {}: '{}' is a symbolic link loop",
         fmt::join(opt.paths, ", "), loops[0]);
  if (files.empty()) fail("input.paths: no input files found in {}", fmt::join(opt.paths, ", "));

  std::vector<Shard> shards;
  for (const auto& [path, f] : files) {
    if (f == SourceFormat::Jsonl) {
      for (Shard& s : split_jsonl(path, opt.shard_mb << 20)) shards.push_back(std::move(s));
      continue;
    }
    if (f == SourceFormat::Warc || f == SourceFormat::Wet) {
      Shard s;
      s.format = f;
      s.files.emplace_back(path, f);
      s.bytes = file_size_of(path);
      shards.push_back(std::move(s));
      continue;
    }
    if (shards.empty() || shards.back().format != SourceFormat::Text ||
        int64_t(shards.back().files.size()) >= opt.files_per_shard) {
      shards.emplace_back();
      shards.back().format = SourceFormat::Text;  // a group of document files
    }
    shards.back().files.emplace_back(path, f);
    shards.back().bytes += file_size_of(path);
  }
  return shards;
}

namespace {

RecordParser& thread_parser(const InputOptions& opt) {
  thread_local std::unique_ptr<RecordParser> p;
  thread_local std::string keys;
  std::string want = opt.text_key + '\0' + opt.id_key;
  if (!p || keys != want) {
    p = std::make_unique<RecordParser>(opt.text_key, opt.id_key);
    keys = want;
  }
  return *p;
}

void parse_line(std::string_view line, const std::string& file, int64_t line_no,
                const InputOptions& opt, InputRecord& r) {
  r.where = fmt::format("{}:{}", file, line_no);
  r.bytes = int64_t(line.size()) + 1;
  std::string why;
  RecordParser& parser = thread_parser(opt);
  bool ok = parser.parse(line, r.doc, why);
  if (!ok && opt.invalid_utf8 == "replace" && find_invalid_utf8(line) >= 0) {
    std::string fixed = replace_invalid_utf8(line);
    fixed.append(kJsonPadding, ' ');
    ok = parser.parse(std::string_view(fixed.data(), fixed.size() - kJsonPadding), r.doc, why);
    r.repaired = ok;
  }
  if (!ok) {
    r.ok = false;
    r.error = why;
    r.doc = Document{};
    r.doc.id = r.where;
    return;
  }
  if (r.doc.id.empty()) r.doc.id = r.where;
}

void read_document_file(const std::string& path, SourceFormat f, const InputOptions& opt,
                        InputRecord& r) {
  // A name that is not UTF-8 is still read; only its id shows escapes.
  r.where = escape_invalid_utf8(path);
  r.doc.id = r.where;
  r.doc.meta = {{"source", r.where}, {"format", source_format_name(f)}};
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    r.ok = false;
    r.error = fmt::format("cannot read: {}", std::strerror(errno));
    return;
  }
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) {
    r.ok = false;
    r.error = "cannot read: I/O error";
    return;
  }
  r.bytes = int64_t(bytes.size());
  int64_t bad = find_invalid_utf8(bytes);
  if (bad >= 0) {
    if (opt.invalid_utf8 == "skip") {
      r.ok = false;
      r.error = fmt::format("invalid UTF-8 at byte {}", bad);
      return;
    }
    bytes = replace_invalid_utf8(bytes);
    r.repaired = true;
  }
  r.doc.text = std::move(bytes);
}

}  // namespace

bool ShardReader::next(std::vector<InputRecord>& out, size_t batch_bytes) {
  out.clear();
  if (warc_) return next_warc(out, batch_bytes);
  if (jsonl_) {
    LineBlock block;
    if (!jsonl_->read_block(block, batch_bytes)) return false;
    // Line starts; blank lines are not records.
    std::vector<std::pair<size_t, int64_t>> lines;  // offset, line number
    std::string_view all = block.lines();
    size_t pos = 0;
    for (int64_t i = 0; i < block.num_lines; ++i) {
      size_t end = all.find('\n', pos);
      std::string_view line = all.substr(pos, end - pos);
      if (line.find_first_not_of(" \t\r") != std::string_view::npos)
        lines.emplace_back(pos, block.first_line + i);
      pos = end + 1;
    }
    out.resize(lines.size());
    const std::string file = escape_invalid_utf8(jsonl_->path());  // for ids "FILE:LINE"
    parallel_for(int64_t(lines.size()), 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        size_t start = lines[size_t(i)].first;
        size_t end = all.find('\n', start);
        parse_line(all.substr(start, end - start), file, lines[size_t(i)].second, opt_,
                   out[size_t(i)]);
      }
    });
    bytes_done_ = jsonl_->bytes_consumed();
    return true;
  }
  if (next_file_ >= shard_.files.size()) return false;
  size_t first = next_file_, bytes = 0;
  while (next_file_ < shard_.files.size() && (next_file_ == first || bytes < batch_bytes)) {
    bytes += size_t(file_size_of(shard_.files[next_file_].first));
    ++next_file_;
  }
  out.resize(next_file_ - first);
  parallel_for(int64_t(out.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const auto& [path, f] = shard_.files[first + size_t(i)];
      read_document_file(path, f, opt_, out[size_t(i)]);
    }
  });
  bytes_done_ += int64_t(bytes);
  return true;
}

namespace {

// A WARC record chosen for a document, decoded in parallel.
struct WarcItem {
  enum Kind { Html, Text, Bad } kind = Bad;
  std::string where, id, url, date, error;
  std::string block;
  HttpResponse http;    // Html
  std::string charset;  // Text: the WARC Content-Type's charset parameter
};

// Blocks larger than this are skipped (counted as warc_skipped_too_large);
// bodies that decode (gzip content coding) to more are bad records.
constexpr int64_t kMaxWarcBlock = int64_t(64) << 20;
// Bytes of a response block searched for the end of its HTTP header.
constexpr size_t kMaxHttpHead = size_t(64) << 10;

std::string lower_ascii(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return s;
}

// The media type of a Content-Type value, lower case, without parameters.
std::string media_type(const std::string& ct) {
  std::string t = lower_ascii(ct.substr(0, ct.find(';')));
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.pop_back();
  while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.erase(0, 1);
  return t;
}

void decode_warc_item(WarcItem& it, const InputOptions& opt, InputRecord& r, CharsetFrom& from,
                      bool& unusable) {
  r.where = it.where;
  r.bytes = int64_t(it.block.size());
  r.doc.id = !it.id.empty() ? it.id : !it.url.empty() ? it.url : it.where;
  if (it.kind == WarcItem::Bad) {
    r.ok = false;
    r.error = it.error;
    r.doc.id = it.where;
    return;
  }
  std::string_view bytes = it.block;
  std::string body;
  const bool html = it.kind == WarcItem::Html;
  std::string declared = it.charset;
  if (html) {
    bytes.remove_prefix(std::min(it.http.body_offset, bytes.size()));
    if (!it.http.transfer_encoding.empty() || !it.http.content_encoding.empty()) {
      std::string why;
      if (!decode_http_body(bytes, it.http, body, why, size_t(kMaxWarcBlock))) {
        r.ok = false;
        r.error = why;
        return;
      }
      bytes = body;
    }
    declared = charset_param(it.http.content_type);
  }
  DecodedText d = decode_to_utf8(bytes, declared, html);
  from = d.from;
  unusable = d.declared_unusable;
  if (d.lossy) {
    if (opt.invalid_utf8 == "skip") {
      r.ok = false;
      r.error =
          fmt::format("bytes not valid in charset {} ({})", d.charset, charset_from_name(d.from));
      return;
    }
    r.repaired = true;
  }
  r.doc.text = std::move(d.text);
  r.doc.meta = {{"url", it.url},
                {"date", it.date},
                {"source", it.where},
                {"charset", d.charset},
                {"charset_from", charset_from_name(d.from)},
                {"format", html ? "html" : "text"}};
}

}  // namespace

namespace {

// The records of one batch, read (sequentially: decompression and parsing)
// ahead of their decoding.
struct WarcBatch {
  std::vector<WarcItem> items;
  Counters counts;
  bool done = false;           // the file's end was reached
  int64_t bytes_consumed = 0;  // of the file, after the batch
};

WarcBatch read_warc_batch(WarcReader& rd, size_t batch_bytes, int64_t& warnings) {
  WarcBatch out;
  Counters& counts = out.counts;
  std::vector<WarcItem>& items = out.items;
  size_t bytes = 0;
  auto bad = [&](const std::string& where, const std::string& error) {
    WarcItem it;
    it.where = where;
    it.error = "corrupt WARC record: " + error;
    ++counts["warc_corrupt_records"];
    if (warnings < 10)
      NK_WARN("curate: {}: {} (record skipped)", where, error);
    else if (warnings == 10)
      NK_WARN("curate: {}: further damaged records are listed in removed/ only",
              escape_invalid_utf8(rd.path()));
    ++warnings;
    items.push_back(std::move(it));
  };
  // Skips the current block, or reports the damage found in it.
  auto skip = [&](const WarcHeader& h, const std::string& counter) {
    std::string error;
    if (!rd.skip_block(error)) return bad(h.where, error);
    ++counts[counter];
  };
  while (bytes < batch_bytes) {
    WarcHeader h;
    std::string error, where;
    WarcReader::Next st = rd.next(h, error, where);
    if (st == WarcReader::Next::End) {
      out.done = true;
      break;
    }
    if (st == WarcReader::Next::Corrupt) {
      bad(where, error);
      continue;
    }
    ++counts["warc_records"];
    bytes += 512;  // a skipped record still costs its header
    const std::string type = lower_ascii(h.type());
    WarcItem it;
    if (type == "response") {
      if (media_type(h.get("Content-Type")) != "application/http") {
        skip(h, "warc_skipped_non_html");  // dns:, ftp: and other non-HTTP responses
        continue;
      }
      std::string_view head = rd.peek_block(kMaxHttpHead);
      if (!parse_http_head(head, it.http)) {
        std::string damage;
        const bool intact = rd.skip_block(damage);
        bad(h.where, intact ? "malformed HTTP response header" : damage);
        continue;
      }
      if (it.http.status < 200 || it.http.status > 299) {
        skip(h, "warc_skipped_status");
        continue;
      }
      std::string mt = media_type(it.http.content_type);
      if (mt.empty()) mt = media_type(h.get("WARC-Identified-Payload-Type"));
      if (mt != "text/html" && mt != "application/xhtml+xml") {
        skip(h, "warc_skipped_non_html");
        continue;
      }
      const std::string& ce = it.http.content_encoding;
      if (!(ce.empty() || ce == "identity" || ce == "none" || ce == "gzip" || ce == "x-gzip" ||
            ce == "deflate")) {
        skip(h, "warc_skipped_content_encoding");
        continue;
      }
      it.kind = WarcItem::Html;
    } else if (type == "conversion") {
      it.kind = WarcItem::Text;
      it.charset = charset_param(h.get("Content-Type"));
    } else {
      static const std::set<std::string> kTypes = {"warcinfo", "request",  "metadata",
                                                   "revisit",  "resource", "continuation"};
      skip(h, kTypes.count(type) ? "warc_skipped_" + type : "warc_skipped_other_type");
      continue;
    }
    if (h.content_length > kMaxWarcBlock) {
      skip(h, "warc_skipped_too_large");
      continue;
    }
    if (!rd.read_block(it.block, error)) {
      bad(h.where, error);
      continue;
    }
    if (!h.get("WARC-Truncated").empty()) ++counts["warc_truncated_payload"];
    it.where = h.where;
    it.id = h.record_id();
    it.url = h.target_uri();
    it.date = h.get("WARC-Date");
    bytes += it.block.size();
    items.push_back(std::move(it));
  }
  out.bytes_consumed = rd.bytes_consumed();
  return out;
}

}  // namespace

// A WARC shard: the reader, and the next batch being read by a thread of its
// own while the current one is decoded and goes through the stages (the
// decompression is sequential; this overlaps it with everything else).
struct ShardReader::WarcState {
  std::unique_ptr<WarcReader> reader;
  int64_t warnings = 0;
  bool done = false;
  std::future<WarcBatch> ahead;  // declared after `reader`, so it is joined first
};

ShardReader::~ShardReader() = default;

ShardReader::ShardReader(const Shard& shard, const InputOptions& opt) : shard_(shard), opt_(opt) {
  if (shard.format == SourceFormat::Jsonl) {
    jsonl_ = std::make_unique<JsonlReader>(shard.files.at(0).first);
    if (shard.offset >= 0) jsonl_->restrict_to(shard.offset, shard.bytes, shard.first_line);
  }
  if (shard.format == SourceFormat::Warc || shard.format == SourceFormat::Wet) {
    warc_ = std::make_unique<WarcState>();
    warc_->reader = std::make_unique<WarcReader>(shard.files.at(0).first);
  }
}

bool ShardReader::next_warc(std::vector<InputRecord>& out, size_t batch_bytes) {
  WarcState& w = *warc_;
  if (w.done && !w.ahead.valid()) return false;
  WarcBatch b =
      w.ahead.valid() ? w.ahead.get() : read_warc_batch(*w.reader, batch_bytes, w.warnings);
  if (!b.done) {
    WarcReader* rd = w.reader.get();
    int64_t* warnings = &w.warnings;
    w.ahead = std::async(std::launch::async, [rd, batch_bytes, warnings] {
      return read_warc_batch(*rd, batch_bytes, *warnings);
    });
  }
  w.done = b.done;
  for (const auto& [k, v] : b.counts) counts_[k] += v;
  std::vector<WarcItem>& items = b.items;
  out.resize(items.size());
  std::vector<CharsetFrom> from(items.size(), CharsetFrom::Default);
  std::vector<char> unusable(items.size(), 0);
  parallel_for(int64_t(items.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      bool u = false;
      decode_warc_item(items[size_t(i)], opt_, out[size_t(i)], from[size_t(i)], u);
      unusable[size_t(i)] = u;
    }
  });
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].kind == WarcItem::Bad || !out[i].ok) continue;
    ++counts_[std::string("charset_") + charset_from_name(from[i])];
    if (unusable[i]) ++counts_["charset_declared_unusable"];
    if (out[i].repaired) ++counts_["charset_lossy"];
  }
  bytes_done_ = b.bytes_consumed;
  return true;
}

}  // namespace nk::curate
