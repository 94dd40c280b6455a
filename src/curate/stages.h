// The registry of stage types a pipeline file may name. Each group of stages
// registers its types from its own file (register_*_stages below); the runner
// looks a `type:` up here.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "curate/document.h"
#include "curate/stage_config.h"

namespace nk::curate {

struct StageFactory {
  std::string type;  // as written in the pipeline file: "word_count"
  std::string help;  // one line for `nekton curate --help`
  // Exactly one of the two is set. Each reads its keys from the StageConfig
  // (the runner calls finish() after), and throws nk::Error naming the key for
  // a bad value.
  std::function<std::unique_ptr<DocStage>(StageConfig&)> make_doc;
  std::function<std::unique_ptr<GlobalStage>(StageConfig&)> make_global;
};

class StageRegistry {
 public:
  void add(StageFactory f);                                 // a type registered twice is a bug
  const StageFactory* find(const std::string& type) const;  // nullptr if unknown
  const std::vector<StageFactory>& all() const { return all_; }

 private:
  std::vector<StageFactory> all_;
};

// Every built-in stage type.
const StageRegistry& stage_registry();

// One per group, each in its own file.
void register_extract_stages(StageRegistry& r);   // html_to_text, latex_to_text
void register_clean_stages(StageRegistry& r);     // clean
void register_filter_stages(StageRegistry& r);    // heuristic filters (Gopher, C4, FineWeb)
void register_pii_stages(StageRegistry& r);       // pii
void register_decontam_stages(StageRegistry& r);  // decontaminate
void register_fasttext_stages(StageRegistry& r);  // language_id, classifier
void register_dedup_stages(StageRegistry& r);     // exact_dedup, fuzzy_dedup

}  // namespace nk::curate
