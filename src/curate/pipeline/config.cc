#include "curate/pipeline/config.h"

#include <xxhash.h>

#include <fmt/format.h>

#include "core/error.h"
#include "curate/yaml_keys.h"

namespace nk::curate {

namespace {

std::string mark(const std::string& file, const YAML::Node& n) {
  return n.Mark().is_null() ? file : fmt::format("{}:{}", file, n.Mark().line + 1);
}

// Every key of a pipeline file but `stages`, each bound to its field.
void bind_pipeline(YamlKeys& k, PipelineConfig& c) {
  InputOptions& in = c.input;
  k.bind("input.paths", in.paths,
         "JSONL (plain or zstd) and WARC/WET (plain or gzip) files; folders of .html, .tex, .txt "
         "files (one document each)");
  k.bind("input.format", in.format, "auto (by extension), jsonl, text, html, latex, warc, wet");
  k.bind("input.text_key", in.text_key, "JSONL field with the text");
  k.bind("input.id_key", in.id_key, "JSONL field with the id (missing ids become FILE:LINE)");
  k.bind("input.files_per_shard", in.files_per_shard, "document files per output shard");
  k.bind("input.shard_mb", in.shard_mb,
         "plain JSONL files above this split into shards of about this size (0: never)");
  k.bind("input.invalid_utf8", in.invalid_utf8,
         "replace (U+FFFD, counted) or skip (counted as bad)");
  k.bind("output.dir", c.output_dir, "data/ and removed/ shards, report.json");
  k.bind("workers", c.workers, "threads (0: all cores)");
  k.bind("batch_mb", c.batch_mb, "documents processed together (bounds memory)");
  k.bind("progress", c.progress, "auto, bar, log, none");
  k.bind("tensorboard", c.tensorboard,
         "write report.json's counters as a TensorBoard event file in output.dir (the stages "
         "as the step axis)");
  k.bind("timeout_s", c.timeout_s,
         "under mpirun: seconds a rank waits for the others at a collective before it fails");
}

}  // namespace

PipelineConfig load_pipeline_config(const std::string& path,
                                    const std::vector<std::string>& overrides) {
  PipelineConfig c;
  c.file = path;
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    fail("cannot read pipeline file '{}'", path);
  } catch (const YAML::Exception& e) {
    fail("{}:{}: invalid YAML: {}", path, e.mark.line + 1, e.msg);
  }
  if (!root.IsMap()) fail("{}: the top level must be a map (input, output, stages, ...)", path);
  // The keys, declared alone (a map with none of them), check the overrides.
  YamlKeys declared(YAML::Node(YAML::NodeType::Map), path);
  PipelineConfig unused;
  bind_pipeline(declared, unused);
  const ConfigSchema& keys = declared.schema();
  for (const std::string& o : overrides) {
    size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0)
      fail("override '{}': expected key=value (e.g. output.dir=curated)", o);
    std::string key = o.substr(0, eq), value = o.substr(eq + 1);
    if (!keys.has(key)) {
      std::string msg = config_unknown_key_message(keys, key, fmt::format("override '{}'", o));
      std::vector<std::string> names;
      for (const ConfigSchema::Field& f : keys.fields()) names.push_back(f.key);
      if (keys.nearest_key(key).empty())
        msg += fmt::format(" (settable: {})", fmt::join(names, ", "));
      throw Error(msg);
    }
    size_t dot = key.find('.');
    std::string section = dot == std::string::npos ? "" : key.substr(0, dot);
    std::string leaf = dot == std::string::npos ? key : key.substr(dot + 1);
    YAML::Node target = section.empty() ? root : root[section];
    if (key == "input.paths") {
      YAML::Node list(YAML::NodeType::Sequence);
      for (const std::string& p : split_commas(value)) list.push_back(p);
      target[leaf] = list;
    } else {
      target[leaf] = value;
    }
  }

  YamlKeys k(root, path);
  bind_pipeline(k, c);
  k.finish({"stages"});
  if (c.input.paths.empty()) fail("{}: missing input.paths (files or folders to curate)", path);
  if (c.output_dir.empty()) fail("{}: missing output.dir (where the curated shards go)", path);
  if (c.batch_mb < 1) fail("{}: batch_mb must be >= 1", mark(path, root["batch_mb"]));
  if (!(c.timeout_s > 0)) fail("{}: timeout_s must be > 0", mark(path, root["timeout_s"]));
  if (c.progress != "auto" && c.progress != "bar" && c.progress != "log" && c.progress != "none")
    fail("{}: progress: expected auto, bar, log or none, got '{}'", path, c.progress);

  YAML::Node in = root["input"];
  c.stages = root["stages"];
  if (!c.stages || !c.stages.IsSequence() || c.stages.size() == 0)
    fail("{}: 'stages' must be a non-empty list of stages (each with a 'type')", path);
  // What decides the output: inputs and stages, not threads or batch sizes.
  YAML::Emitter em;
  em << in << c.stages;
  c.fingerprint = fmt::format("{:016x}", XXH3_64bits(em.c_str(), em.size()));
  return c;
}

}  // namespace nk::curate
