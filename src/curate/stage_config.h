// The settings of one pipeline stage: a YAML map such as
//   - type: word_count
//     min_words: 50
// with typed getters. Every error names the pipeline file, the line and the
// stage ("pipeline.yaml:12: stage 3 (word_count): key 'min_words': expected an
// integer, got 'many'"); finish() rejects keys no getter asked for, naming the
// known ones, so a typo never passes silently.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace nk::curate {

class StageConfig {
 public:
  // `file`: the pipeline file (for messages); `index`: 1-based stage number.
  StageConfig(YAML::Node node, std::string file, int index);

  const std::string& type() const { return type_; }
  const std::string& name() const { return name_; }  // `name:` if given, else the type
  // "pipeline.yaml:12: stage 3 (word_count)", for messages.
  const std::string& where() const { return where_; }

  bool has(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t def);
  double get_double(const std::string& key, double def);
  bool get_bool(const std::string& key, bool def);
  std::string get_string(const std::string& key, const std::string& def);
  // A YAML list of scalars (a single scalar reads as a list of one).
  std::vector<std::string> get_strings(const std::string& key, const std::vector<std::string>& def);
  std::vector<double> get_doubles(const std::string& key, const std::vector<double>& def);
  // A map of scalar keys to numbers, e.g. {2: 0.2, 3: 0.18}.
  std::vector<std::pair<std::string, double>> get_number_map(
      const std::string& key, const std::vector<std::pair<std::string, double>>& def);
  std::string require_string(const std::string& key);  // nk::Error when absent

  // nk::Error "<where>: key 'k': <msg>" (with the key's own line when it has one).
  [[noreturn]] void fail_key(const std::string& key, const std::string& msg) const;
  // nk::Error for any key in the map that no getter asked for.
  void finish() const;

 private:
  YAML::Node value(const std::string& key);  // marks it used; null node when absent
  std::string where_key(const std::string& key) const;

  YAML::Node node_;
  std::string file_, type_, name_, label_, where_;
  int index_ = 0;
  std::set<std::string> used_;
};

}  // namespace nk::curate
