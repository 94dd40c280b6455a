#include "data/preprocess.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/output_lock.h"
#include "core/progress.h"
#include "data/dataset/indexed_dataset.h"
#include "data/jsonl_reader.h"
#include "data/tokenizer/tokenizer.h"
#include "data/utf8.h"

namespace nk {

namespace {

constexpr size_t kMaxExamples = 5;

struct Job {
  int64_t seq = 0;
  int file = 0;
  int64_t input_done = 0;  // bytes of all inputs consumed when the block was cut
  LineBlock block;
  std::string error;  // the reader failed here; reported in input order
};

struct BadRecord {
  int64_t line;
  RecordStatus status;
  std::string why;
};

// A tokenized block: documents back to back in `tokens`, doc_ends[i] one past
// document i.
struct Result {
  int file = 0;
  int64_t input_done = 0, text_bytes = 0, lines = 0, blank = 0, empty = 0, replaced = 0;
  std::vector<int32_t> tokens;
  std::vector<size_t> doc_ends;
  std::vector<BadRecord> bad;
  std::string error;
};

bool is_blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

struct WorkerState {
  JsonFieldReader fields;
  std::string repaired;  // a line with U+FFFD in place of invalid UTF-8, then padding
  explicit WorkerState(const std::string& key) : fields(key) {}
};

void tokenize_block(const Job& job, const PreprocessOptions& opt, const Tokenizer& tok,
                    bool replace_utf8, WorkerState& ws, Result& r) {
  std::string_view all = job.block.lines();
  r.file = job.file;
  r.input_done = job.input_done;
  r.text_bytes = int64_t(all.size());
  r.tokens.reserve(all.size() / 4);  // a first guess; pooled vectors already hold more
  const int32_t eod = tok.eod_id(), bos = tok.bos_id();
  size_t pos = 0;
  int64_t line_no = job.block.first_line;
  for (; pos < all.size(); ++line_no) {
    size_t nl = all.find('\n', pos);                    // each line of a block ends in '\n'
    std::string_view line = all.substr(pos, nl - pos);  // followed by >= kJsonPadding bytes
    pos = nl + 1;
    ++r.lines;
    if (is_blank(line)) {
      ++r.blank;
      continue;
    }
    std::string_view text;
    std::string why;
    RecordStatus st = ws.fields.read(line, text, why);
    if (st == RecordStatus::InvalidUtf8 && replace_utf8) {
      ws.repaired.clear();
      append_replacing_invalid_utf8(line, ws.repaired);
      size_t n = ws.repaired.size();
      ws.repaired.append(kJsonPadding, ' ');
      st = ws.fields.read(std::string_view(ws.repaired.data(), n), text, why);
      if (st == RecordStatus::Ok) ++r.replaced;
    }
    if (st != RecordStatus::Ok) {
      r.bad.push_back({line_no, st, std::move(why)});
      if (!opt.skip_bad) return;  // the run stops at this record
      continue;
    }
    const size_t before = r.tokens.size();
    if (opt.prepend_bos) r.tokens.push_back(bos);
    const size_t text_at = r.tokens.size();
    tok.encode(text, r.tokens);
    if (r.tokens.size() == text_at) {  // an empty document: no BOS alone either
      r.tokens.resize(before);
      ++r.empty;
      continue;
    }
    if (opt.append_eod) r.tokens.push_back(eod);
    r.doc_ends.push_back(r.tokens.size());
  }
}

// The reader -> workers -> writer hand-over. `in_flight` counts blocks from
// the moment the reader queues them until the writer has consumed them. Text
// and token buffers go round through pools instead of back to malloc, whose
// per-thread arenas would otherwise keep freed blocks resident.
struct Pipeline {
  std::mutex m;
  std::vector<std::string> text_pool;
  std::vector<std::vector<int32_t>> token_pool;
  size_t keep_bytes = 0;  // buffers larger than this (after a huge line) are freed instead
  std::condition_variable work_cv, done_cv, space_cv;
  std::deque<Job> work;
  std::map<int64_t, Result> done;
  int64_t in_flight = 0, max_in_flight = 0;
  int64_t total_jobs = -1;  // set when the reader is finished
  int64_t input_total = 0;  // bytes the reader consumed from all files
  bool stop = false;

  // Callers hold m.
  void recycle(std::string&& s) {
    if (s.capacity() <= keep_bytes) text_pool.push_back(std::move(s));
  }
  void recycle(std::vector<int32_t>&& v) {
    if (v.capacity() * sizeof(int32_t) <= 4 * keep_bytes) {
      v.clear();
      token_pool.push_back(std::move(v));
    }
  }

  void halt() {
    std::lock_guard lk(m);
    stop = true;
    work_cv.notify_all();
    space_cv.notify_all();
    done_cv.notify_all();
  }
};

void reader_thread(Pipeline& p, const PreprocessOptions& opt) {
  int64_t seq = 0, base = 0;
  // Waits for room before a block is read, so the reader holds none extra.
  auto take_slot = [&] {
    std::unique_lock lk(p.m);
    p.space_cv.wait(lk, [&] { return p.stop || p.in_flight < p.max_in_flight; });
    return !p.stop;
  };
  auto push = [&](Job&& j) {
    std::unique_lock lk(p.m);
    if (p.stop) return false;
    j.seq = seq++;
    ++p.in_flight;
    p.work.push_back(std::move(j));
    p.work_cv.notify_one();
    return true;
  };
  try {
    for (size_t f = 0; f < opt.inputs.size(); ++f) {
      JsonlReader rd(opt.inputs[f], opt.max_line_bytes);
      for (;;) {
        if (!take_slot()) return;
        Job j;
        j.file = int(f);
        {
          std::lock_guard lk(p.m);
          if (!p.text_pool.empty()) {
            j.block.bytes = std::move(p.text_pool.back());
            p.text_pool.pop_back();
          }
        }
        if (!rd.read_block(j.block, size_t(opt.block_bytes))) break;
        j.input_done = base + j.block.input_end;
        if (!push(std::move(j))) return;
      }
      base += rd.bytes_consumed();
    }
  } catch (const std::exception& e) {
    Job j;
    j.error = e.what();
    if (!push(std::move(j))) return;
  }
  std::lock_guard lk(p.m);
  p.total_jobs = seq;
  p.input_total = base;
  p.done_cv.notify_all();
  p.work_cv.notify_all();
}

void worker_thread(Pipeline& p, const PreprocessOptions& opt, const Tokenizer& tok) {
  WorkerState ws(opt.json_key);
  bool replace_utf8 = opt.invalid_utf8 == "replace";
  for (;;) {
    Job j;
    {
      std::unique_lock lk(p.m);
      p.work_cv.wait(lk, [&] { return p.stop || !p.work.empty() || p.total_jobs >= 0; });
      if (p.stop || p.work.empty()) return;
      j = std::move(p.work.front());
      p.work.pop_front();
    }
    Result r;
    {
      std::lock_guard lk(p.m);
      if (!p.token_pool.empty()) {
        r.tokens = std::move(p.token_pool.back());
        p.token_pool.pop_back();
      }
    }
    if (!j.error.empty()) {
      r.error = std::move(j.error);
    } else {
      try {
        tokenize_block(j, opt, tok, replace_utf8, ws, r);
      } catch (const std::exception& e) {
        r.error = fmt::format("{}: lines {}-{}: {}", opt.inputs[size_t(j.file)], j.block.first_line,
                              j.block.first_line + j.block.num_lines - 1, e.what());
      }
    }
    std::lock_guard lk(p.m);
    p.recycle(std::move(j.block.bytes));
    p.done.emplace(j.seq, std::move(r));
    p.done_cv.notify_all();
  }
}

void check_options(const PreprocessOptions& opt) {
  if (opt.inputs.empty()) fail("preprocess: no input files (preprocess.input)");
  if (opt.output_prefix.empty()) fail("preprocess: no output prefix (preprocess.output_prefix)");
  if (opt.json_key.empty()) fail("preprocess: json_key must not be empty");
  if (opt.invalid_utf8 != "error" && opt.invalid_utf8 != "replace")
    fail("preprocess: invalid_utf8 must be 'error' or 'replace', got '{}'", opt.invalid_utf8);
  if (opt.block_bytes <= 0)
    fail("preprocess: block_bytes must be positive, got {}", opt.block_bytes);
  if (opt.max_line_bytes <= 0)
    fail("preprocess: max_line_bytes must be positive, got {}", opt.max_line_bytes);
}

std::string mb(int64_t bytes) {
  return fmt::format("{:.1f} MB", double(bytes) / 1e6);
}

std::string count(double x) {
  return x >= 1e6   ? fmt::format("{:.1f}M", x / 1e6)
         : x >= 1e4 ? fmt::format("{:.1f}k", x / 1e3)
                    : fmt::format("{:.0f}", x);
}

// The folders of an output path that do not exist yet (data/ in
// data/corpus_text_document), made as nekton train makes its out_dir, and
// removed again, while still empty, unless the run succeeds: a failed run
// leaves nothing behind.
class MissingFolders {
 public:
  explicit MissingFolders(const std::filesystem::path& dir) {
    for (std::filesystem::path p = dir; !p.empty() && !std::filesystem::exists(p);
         p = p.parent_path())
      made_.push_back(p);
    if (!made_.empty()) std::filesystem::create_directories(dir);
  }
  ~MissingFolders() {
    std::error_code ec;
    if (!keep_)
      for (const auto& p : made_)  // innermost first; remove() leaves a folder with files
        if (!std::filesystem::remove(p, ec)) break;
  }
  void keep() { keep_ = true; }

 private:
  std::vector<std::filesystem::path> made_;
  bool keep_ = false;
};

}  // namespace

double PreprocessStats::text_mb_per_s() const {
  return seconds > 0 ? double(text_bytes) / 1e6 / seconds : 0.0;
}

std::string PreprocessStats::summary() const {
  std::string s = fmt::format("{} documents, {} tokens ({})\n", documents, tokens, dtype);
  s += fmt::format("read {} ({} of JSONL, {} lines) in {:.2f} s: {:.1f} MB/s", mb(input_bytes),
                   mb(text_bytes), lines, seconds, text_mb_per_s());
  s += fmt::format(", {:.1f} MB/s per worker ({} worker{})\n",
                   text_mb_per_s() / std::max(workers, 1), workers, workers == 1 ? "" : "s");
  s += fmt::format("skipped: {} empty documents, {} blank lines", empty_documents, blank_lines);
  if (skipped_bad() > 0)
    s += fmt::format(
        ", {} bad records ({} invalid JSON, {} missing key, {} not a string, {} invalid UTF-8)",
        skipped_bad(), invalid_json, missing_key, not_string, invalid_utf8);
  if (utf8_replaced_records > 0)
    s += fmt::format("; {} records kept with invalid UTF-8 replaced by U+FFFD",
                     utf8_replaced_records);
  s += "\n";
  for (auto& e : skipped_examples) s += "  skipped " + e + "\n";
  if (int64_t(skipped_examples.size()) < skipped_bad()) s += "  ...\n";
  return s;
}

std::string format_progress(const PreprocessProgress& p, int bar_width) {
  double frac = p.input_bytes_total > 0
                    ? std::min(1.0, double(p.input_bytes_done) / double(p.input_bytes_total))
                    : 0.0;
  if (p.finished) frac = 1.0;
  double secs = std::max(p.seconds, 1e-9);
  std::string eta = p.finished ? "done"
                    : frac > 0 ? format_eta(p.seconds * (1.0 - frac) / frac)
                               : "?";
  return fmt::format("{} {:5.1f}%  {}/{}  {:.1f} MB/s  {} docs/s  ETA {}",
                     progress_bar(frac, bar_width), frac * 100.0, mb(p.input_bytes_done),
                     mb(p.input_bytes_total), double(p.text_bytes) / 1e6 / secs,
                     count(double(p.documents) / secs), eta);
}

PreprocessStats preprocess_jsonl(const PreprocessOptions& opt,
                                 const std::function<void(const PreprocessProgress&)>& progress) {
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  check_options(opt);
  MissingFolders folders(std::filesystem::path(opt.output_prefix).parent_path());
  // PREFIX.lock: one run writes PREFIX.bin/.idx at a time, so whatever
  // temporaries of them are found belong to a killed run.
  OutputLock lock(opt.output_prefix, LockAt::Beside);
  for (const char* ext : {".bin", ".idx"}) remove_stale_temporaries_of(opt.output_prefix + ext);
  std::unique_ptr<Tokenizer> tok = load_tokenizer(opt.tokenizer);
  if (opt.append_eod && tok->eod_id() < 0)
    fail("preprocess: tokenizer '{}' has no end-of-document token; set append_eod=false",
         opt.tokenizer);
  if (opt.prepend_bos && tok->bos_id() < 0)
    fail(
        "preprocess.prepend_bos: tokenizer '{}' has no beginning-of-document (BOS) token (a "
        "SentencePiece model's <s>, or the bos_token of a Hugging Face tokenizer_config.json); "
        "leave prepend_bos=false",
        opt.tokenizer);
  PreprocessProgress prog;
  for (auto& path : opt.inputs) prog.input_bytes_total += JsonlReader(path).file_bytes();

  PreprocessStats st;
  st.workers =
      opt.workers > 0 ? opt.workers : int(std::max(1u, std::thread::hardware_concurrency()));
  IndexDType dtype = token_dtype_for_vocab(tok->vocab_size());
  st.dtype = index_dtype_name(dtype);
  IndexedDatasetWriter out(opt.output_prefix, dtype);

  Pipeline p;
  p.max_in_flight = 2 * int64_t(st.workers);
  p.keep_bytes = 4 * size_t(opt.block_bytes) + (size_t(1) << 20);
  std::vector<std::thread> threads;
  // Stops and joins every thread on the way out, error or not.
  struct Joiner {
    Pipeline& p;
    std::vector<std::thread>& t;
    ~Joiner() {
      p.halt();
      for (auto& th : t) th.join();
    }
  } joiner{p, threads};
  threads.emplace_back(reader_thread, std::ref(p), std::cref(opt));
  for (int w = 0; w < st.workers; ++w)
    threads.emplace_back(worker_thread, std::ref(p), std::cref(opt), std::cref(*tok));

  auto seconds = [&] { return std::chrono::duration<double>(clock::now() - t0).count(); };
  double last_report = 0;  // the first call comes after progress_every_s
  for (int64_t next = 0;; ++next) {
    Result r;
    {
      std::unique_lock lk(p.m);
      p.done_cv.wait(lk, [&] { return p.done.count(next) || next == p.total_jobs; });
      if (next == p.total_jobs) {
        st.input_bytes = p.input_total;
        break;
      }
      auto it = p.done.find(next);
      r = std::move(it->second);
      p.done.erase(it);
      --p.in_flight;
      p.space_cv.notify_one();
    }
    if (!r.error.empty()) throw Error(r.error);
    const std::string& file = opt.inputs[size_t(r.file)];
    for (auto& b : r.bad) {
      if (!opt.skip_bad)
        fail("{}:{}: {}: {} (preprocess.skip_bad=true skips such records)", file, b.line,
             record_status_name(b.status), b.why);
      switch (b.status) {
        case RecordStatus::InvalidJson:
          ++st.invalid_json;
          break;
        case RecordStatus::MissingKey:
          ++st.missing_key;
          break;
        case RecordStatus::NotString:
          ++st.not_string;
          break;
        case RecordStatus::InvalidUtf8:
          ++st.invalid_utf8;
          break;
        case RecordStatus::Ok:
          break;
      }
      if (st.skipped_examples.size() < kMaxExamples)
        st.skipped_examples.push_back(
            fmt::format("{}:{}: {}: {}", file, b.line, record_status_name(b.status), b.why));
    }
    size_t start = 0;
    for (size_t end : r.doc_ends) {
      out.add_document(std::span<const int32_t>(r.tokens.data() + start, end - start));
      start = end;
    }
    {
      std::lock_guard lk(p.m);
      p.recycle(std::move(r.tokens));
    }
    st.lines += r.lines;
    st.blank_lines += r.blank;
    st.empty_documents += r.empty;
    st.utf8_replaced_records += r.replaced;
    st.text_bytes += r.text_bytes;
    prog.input_bytes_done = r.input_done;
    prog.text_bytes = st.text_bytes;
    prog.documents = out.documents();
    prog.tokens = out.tokens();
    if (progress && seconds() - last_report >= opt.progress_every_s) {
      last_report = seconds();
      prog.seconds = last_report;
      progress(prog);
    }
  }
  out.finish();
  folders.keep();
  st.documents = out.documents();
  st.tokens = out.tokens();
  st.seconds = seconds();
  if (progress) {
    prog.input_bytes_done = st.input_bytes;
    prog.seconds = st.seconds;
    prog.finished = true;
    progress(prog);
  }
  return st;
}

}  // namespace nk
