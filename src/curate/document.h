// The unit a curation pipeline works on, and the two kinds of stage.
//
// A DocStage looks at one document at a time (extraction, cleaning, language
// id, filters, PII): the runner calls it from several threads at once on
// different documents. A GlobalStage needs every document before it can decide
// anything (exact and fuzzy dedup): the runner feeds it all documents that
// reached it, in batches and in the pipeline's global order, then asks which to
// remove.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "curate/ranks.h"

namespace nk::curate {

struct Document {
  std::string id;    // from the input's id field, or "<file>:<line>" / the file's path
  std::string text;  // valid UTF-8 (the runner rejects or repairs anything else first)
  // Labels stages add ("language", "language_score", "quality_score", ...), and
  // for files read from folders "source" and "format" ("html", "latex", "text");
  // WARC records add "url", "date", "source" (FILE@OFFSET), "charset",
  // "charset_from" and "format" (input.h).
  // Written to the output record after the input's own fields.
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
};

// What a DocStage decided for one document.
struct Verdict {
  bool keep = true;
  // Why a removed document was removed, for the removed-documents JSONL: short,
  // with the measured value and the threshold, e.g. "word_count 12 < 50".
  std::string reason;

  static Verdict kept() { return {}; }
  static Verdict removed(std::string why) { return {false, std::move(why)}; }
};

// Named counts a stage reports beyond kept/removed (for example
// "redacted_email"). The runner gives each thread its own and adds them up.
using Counters = std::map<std::string, int64_t>;

class DocStage {
 public:
  virtual ~DocStage() = default;
  // May rewrite doc.text and add doc.meta keys. Called concurrently on
  // different documents: must not change the stage's own state (keep scratch
  // space thread_local). A removed document's text as the stage leaves it is
  // what the removed JSONL records.
  virtual Verdict apply(Document& doc, Counters& counts) const = 0;
};

// One document a GlobalStage removes.
struct Removal {
  uint64_t index = 0;  // in the global order add_batch numbered
  std::string reason;  // e.g. "near-duplicate of 'doc-17' (cluster of 3)"
};

class GlobalStage {
 public:
  virtual ~GlobalStage() = default;
  // Once, before the first batch. `work_dir` is an existing empty folder the
  // stage may spill to; the runner removes it afterwards.
  virtual void begin(const std::string& work_dir) = 0;
  // Called before begin() when the run spans several ranks (curate/ranks.h):
  // this rank's batches start at document `first` of the global order, other
  // ranks add the rest, and finish() is collective, returning every rank's
  // removals on each. False: the stage runs on one process only.
  virtual bool set_ranks(const Ranks* ranks, uint64_t first) {
    (void)ranks, (void)first;
    return false;
  }
  // Documents first .. first + docs.size() - 1 of the global order. Batches come
  // in increasing order, from one thread; the stage may parallelise inside
  // (nk::parallel_for). Memory the stage keeps per document must be small and
  // fixed (a hash, a signature on disk), never the text.
  virtual void add_batch(uint64_t first, const std::vector<Document>& docs) = 0;
  // After the last batch: the documents to remove, sorted by index. Results must
  // depend only on the documents and their order, never on thread timing.
  virtual std::vector<Removal> finish(Counters& counts) = 0;
  // Results that outlive the run (the dedup stages' save_state): right after
  // finish(), save(dir) writes them into `dir` (across ranks, every rank
  // calls it and rank 0 writes), an empty folder of the run's
  // work area that lasts until the run ends, also across a resume; once the
  // run's output is complete, publish(dir) puts them in place. On a resumed
  // run whose stage had finished before the kill, only publish() is called,
  // on a stage object that never ran; `dir` may then be gone (published).
  virtual void save(const std::string& dir) { (void)dir; }
  virtual void publish(const std::string& dir) { (void)dir; }
};

}  // namespace nk::curate
