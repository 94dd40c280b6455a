#include "curate/pipeline/input.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/parallel.h"
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
  for (const char* e : {".txt", ".text", ".md", ".rst"})
    if (ends_with(p, e)) return f = SourceFormat::Text, true;
  return false;
}

SourceFormat forced_format(const std::string& name) {
  if (name == "jsonl") return SourceFormat::Jsonl;
  if (name == "text") return SourceFormat::Text;
  if (name == "html") return SourceFormat::Html;
  if (name == "latex") return SourceFormat::Latex;
  fail("input.format: expected auto, jsonl, text, html or latex, got '{}'", name);
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
    if (shards.empty() || shards.back().format == SourceFormat::Jsonl ||
        int64_t(shards.back().files.size()) >= opt.files_per_shard) {
      shards.emplace_back();
      shards.back().format = SourceFormat::Text;  // a group of document files
    }
    shards.back().files.emplace_back(path, f);
    shards.back().bytes += file_size_of(path);
  }
  return shards;
}

ShardReader::ShardReader(const Shard& shard, const InputOptions& opt) : shard_(shard), opt_(opt) {
  if (shard.format == SourceFormat::Jsonl) {
    jsonl_ = std::make_unique<JsonlReader>(shard.files.at(0).first);
    if (shard.offset >= 0) jsonl_->restrict_to(shard.offset, shard.bytes, shard.first_line);
  }
}

ShardReader::~ShardReader() = default;

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

}  // namespace nk::curate
