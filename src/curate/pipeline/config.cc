#include "curate/pipeline/config.h"

#include <xxhash.h>

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "core/error.h"

namespace nk::curate {

namespace {

std::string mark(const std::string& file, const YAML::Node& n) {
  return n.Mark().is_null() ? file : fmt::format("{}:{}", file, n.Mark().line + 1);
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t c = s.find(',', pos);
    if (c == std::string::npos) c = s.size();
    if (c > pos) out.push_back(s.substr(pos, c - pos));
    pos = c + 1;
  }
  return out;
}

const std::map<std::string, std::vector<std::string>>& known_keys() {
  static const std::map<std::string, std::vector<std::string>> k = {
      {"", {"input", "output", "workers", "batch_mb", "progress", "stages"}},
      {"input",
       {"paths", "format", "text_key", "id_key", "files_per_shard", "shard_mb", "invalid_utf8"}},
      {"output", {"dir"}}};
  return k;
}

void check_keys(const std::string& file, const YAML::Node& map, const std::string& section) {
  const auto& allowed = known_keys().at(section);
  for (const auto& kv : map) {
    std::string k = kv.first.Scalar();
    if (std::find(allowed.begin(), allowed.end(), k) == allowed.end())
      fail("{}: unknown key '{}{}' (allowed here: {})", mark(file, kv.first),
           section.empty() ? "" : section + ".", k, fmt::join(allowed, ", "));
  }
}

std::string scalar(const std::string& file, const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) fail("{}: '{}' expects a single value", mark(file, n), key);
  return n.Scalar();
}

int64_t to_int(const std::string& where, const std::string& key, const std::string& v) {
  try {
    size_t pos = 0;
    long long x = std::stoll(v, &pos);
    if (pos == v.size()) return x;
  } catch (const std::exception&) {
  }
  fail("{}: '{}' expects an integer, got '{}'", where, key, v);
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
  check_keys(path, root, "");
  for (const char* s : {"input", "output"}) {
    if (root[s] && !root[s].IsMap()) fail("{}: '{}' must be a map", mark(path, root[s]), s);
    if (root[s]) check_keys(path, root[s], s);
  }
  for (const std::string& o : overrides) {
    size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0)
      fail("override '{}': expected key=value (e.g. output.dir=curated)", o);
    std::string key = o.substr(0, eq), value = o.substr(eq + 1);
    size_t dot = key.find('.');
    std::string section = dot == std::string::npos ? "" : key.substr(0, dot);
    std::string leaf = dot == std::string::npos ? key : key.substr(dot + 1);
    auto it = known_keys().find(section);
    const auto& allowed = it == known_keys().end() ? known_keys().at("") : it->second;
    if (it == known_keys().end() || leaf == "stages" ||
        (section.empty() && (leaf == "input" || leaf == "output")) ||
        std::find(allowed.begin(), allowed.end(), leaf) == allowed.end())
      fail(
          "override '{}': unknown key '{}' (settable: input.paths, input.format, "
          "input.text_key, input.id_key, input.files_per_shard, input.shard_mb, "
          "input.invalid_utf8, "
          "output.dir, "
          "workers, batch_mb, progress)",
          o, key);
    YAML::Node target = section.empty() ? root : root[section];
    if (key == "input.paths") {
      YAML::Node list(YAML::NodeType::Sequence);
      for (const std::string& p : split_commas(value)) list.push_back(p);
      target[leaf] = list;
    } else {
      target[leaf] = value;
    }
  }

  YAML::Node in = root["input"];
  if (!in || !in["paths"]) fail("{}: missing input.paths (files or folders to curate)", path);
  YAML::Node paths = in["paths"];
  if (paths.IsScalar()) {
    c.input.paths = {paths.Scalar()};
  } else if (paths.IsSequence()) {
    for (const YAML::Node& p : paths) c.input.paths.push_back(scalar(path, p, "input.paths"));
  } else {
    fail("{}: input.paths expects a path or a list of paths", mark(path, paths));
  }
  auto str = [&](const YAML::Node& sec, const char* key, std::string& dst) {
    if (sec && sec[key]) dst = scalar(path, sec[key], key);
  };
  str(in, "format", c.input.format);
  str(in, "text_key", c.input.text_key);
  str(in, "id_key", c.input.id_key);
  str(in, "invalid_utf8", c.input.invalid_utf8);
  if (in["shard_mb"])
    c.input.shard_mb = to_int(mark(path, in["shard_mb"]), "input.shard_mb",
                              scalar(path, in["shard_mb"], "shard_mb"));
  if (in["files_per_shard"])
    c.input.files_per_shard = to_int(mark(path, in["files_per_shard"]), "input.files_per_shard",
                                     scalar(path, in["files_per_shard"], "files_per_shard"));
  YAML::Node out = root["output"];
  str(out, "dir", c.output_dir);
  if (c.output_dir.empty()) fail("{}: missing output.dir (where the curated shards go)", path);
  if (root["workers"])
    c.workers = int(
        to_int(mark(path, root["workers"]), "workers", scalar(path, root["workers"], "workers")));
  if (root["batch_mb"]) {
    c.batch_mb = to_int(mark(path, root["batch_mb"]), "batch_mb",
                        scalar(path, root["batch_mb"], "batch_mb"));
    if (c.batch_mb < 1) fail("{}: batch_mb must be >= 1", mark(path, root["batch_mb"]));
  }
  str(root, "progress", c.progress);
  if (c.progress != "auto" && c.progress != "bar" && c.progress != "log" && c.progress != "none")
    fail("{}: progress: expected auto, bar, log or none, got '{}'", path, c.progress);

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
