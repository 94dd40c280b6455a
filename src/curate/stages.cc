#include "curate/stages.h"

#include "core/error.h"

namespace nk::curate {

void StageRegistry::add(StageFactory f) {
  NK_CHECK(!find(f.type), "stage type '{}' registered twice", f.type);
  NK_CHECK(bool(f.make_doc) != bool(f.make_global), "stage type '{}': set exactly one factory",
           f.type);
  all_.push_back(std::move(f));
}

const StageFactory* StageRegistry::find(const std::string& type) const {
  for (const StageFactory& f : all_)
    if (f.type == type) return &f;
  return nullptr;
}

const StageRegistry& stage_registry() {
  static const StageRegistry r = [] {
    StageRegistry r;
    // REGISTER: one line per group (kept in pipeline order of a typical recipe).
    register_extract_stages(r);
    register_clean_stages(r);
    register_filter_stages(r);
    register_pii_stages(r);
    register_decontam_stages(r);
    register_fasttext_stages(r);
    register_dedup_stages(r);
    return r;
  }();
  return r;
}

}  // namespace nk::curate
