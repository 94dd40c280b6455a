// The pipeline file of `nekton curate` (see runner.h for what a run does with
// it): inputs, output folder, threads, batch size, progress, and the list of
// stages, which the runner builds and checks.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "curate/pipeline/input.h"

namespace nk::curate {

struct PipelineConfig {
  std::string file;  // the pipeline YAML, for messages
  InputOptions input;
  std::string output_dir;
  int workers = 0;                // threads; 0 = all cores
  int64_t batch_mb = 16;          // documents read and processed together
  std::string progress = "auto";  // auto, bar, log, none
  bool tensorboard = true;        // OUT/events.out.tfevents.*: report.json's counters
  double timeout_s = 1800;        // under mpirun: a collective's wait for the other ranks
  YAML::Node stages;              // the `stages:` list
  std::string fingerprint;        // of everything that decides the output
};

// Reads the pipeline file, then applies "key=value" overrides of its scalar
// settings (input.paths=a,b  output.dir=x  workers=2 ...). nk::Error naming the
// file and line, or the override, for anything wrong. The stages themselves
// (types, keys, models) are built and checked by run_pipeline, once, before
// it writes anything.
PipelineConfig load_pipeline_config(const std::string& path,
                                    const std::vector<std::string>& overrides);

}  // namespace nk::curate
