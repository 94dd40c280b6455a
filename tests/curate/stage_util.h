// Builds a curation stage from a YAML snippet as the pipeline runner does:
// registry lookup, factory, then StageConfig::finish() for unknown keys.
// `index` is the stage's number in the messages ("stage 2 (...)").
#pragma once
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <memory>
#include <string>

#include "core/error.h"
#include "curate/stages.h"

namespace nk::curate::test_stage {

inline const StageFactory& factory(const StageConfig& c) {
  const StageFactory* f = stage_registry().find(c.type());
  if (!f) throw Error("no stage type " + c.type());
  return *f;
}

inline std::unique_ptr<DocStage> make_stage(const std::string& yaml, int index = 1) {
  StageConfig c(YAML::Load(yaml), "pipeline.yaml", index);
  const StageFactory& f = factory(c);
  EXPECT_TRUE(f.make_doc) << c.type() << " is not a document stage";
  auto s = f.make_doc(c);
  c.finish();
  return s;
}

inline std::unique_ptr<GlobalStage> make_global_stage(const std::string& yaml, int index = 1) {
  StageConfig c(YAML::Load(yaml), "pipeline.yaml", index);
  const StageFactory& f = factory(c);
  EXPECT_TRUE(f.make_global) << c.type() << " is not a global stage";
  auto s = f.make_global(c);
  c.finish();
  return s;
}

}  // namespace nk::curate::test_stage
