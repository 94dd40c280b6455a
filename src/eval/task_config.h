// A benchmark task as lm-evaluation-harness's YAML defines one (its
// TaskConfig): where the documents are, the Jinja templates that turn a
// document into a prompt, a target and choices, the few-shot settings, the
// output type, metrics and filters. Defaults are the harness's (v0.4.9):
// target_delimiter " ", fewshot_delimiter "\n\n", output_type
// generate_until, until [fewshot_delimiter], max_gen_toks 256, and the
// output type's default metrics.
//
// Keys the harness has whose Python this port cannot run (process_docs,
// process_results, !function templates, include) are refused by name, as
// is any key it does not know.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace YAML {
class Node;
}

namespace nk {

// One entry of metric_list; the keyword options are exact_match's.
struct MetricSpec {
  std::string metric;
  std::string aggregation;  // mean, perplexity, weighted_perplexity, bits_per_byte
  bool higher_is_better = true;
  bool ignore_case = false, ignore_punctuation = false, ignore_numbers = false;
  std::vector<std::string> regexes_to_ignore;
};

// One function of a filter pipeline (lm_eval/filters): regex, take_first,
// take_first_k (the first k answers), majority_vote (the most frequent
// answer, ties to the first seen: Python's Counter.most_common), lowercase,
// uppercase, remove_whitespace.
struct FilterStep {
  std::string function;
  std::string regex_pattern = R"(#### (\-?[0-9\.\,]+))";
  int64_t group_select = 0;
  std::string fallback = "[invalid]";
  int64_t k = 0;  // take_first_k
};

struct FilterSpec {
  std::string name = "none";  // the harness's key suffix: "acc,none"
  std::vector<FilterStep> steps;
};

struct TaskConfig {
  std::string file;                                     // the YAML it came from, for messages
  std::string task, alias, dataset_path, dataset_name;  // alias: task_alias, else task
  // The folder under eval.data holding its splits: the task's name (a
  // group's inline override renamed NAME-k: NAME's).
  std::string data_name;
  std::map<std::string, std::string> data_files;  // dataset_kwargs.data_files: split -> path
  std::optional<std::string> training_split, validation_split, test_split, fewshot_split;
  std::string doc_to_text, doc_to_target;
  // doc_to_choice: a field or a template (rendered to a Python list literal),
  // or a YAML list of the choices themselves.
  std::optional<std::string> doc_to_choice;
  std::optional<std::vector<std::string>> choice_list;
  std::string description, target_delimiter = " ", fewshot_delimiter = "\n\n";
  // gen_prefix: a field or a template; its text for the scored document
  // follows the question (after target_delimiter) and, with a space, opens
  // each shot's answer.
  std::optional<std::string> gen_prefix;
  int64_t num_fewshot = 0;
  std::string sampler = "default";  // fewshot_config.sampler: default or first_n
  std::string output_type = "generate_until";
  std::vector<MetricSpec> metrics;
  std::vector<FilterSpec> filters;  // at least one ("none": take the first response)
  std::vector<std::string> until;
  int64_t max_gen_toks = 256;
  // generation_kwargs: do_sample (with a temperature > 0, top_p, top_k)
  // samples each answer; else greedy. repeats: answers per document
  // (generate_until), which the filters reduce to one.
  bool do_sample = false;
  double temperature = 0, top_p = 1;
  int64_t top_k = 0;
  int64_t repeats = 1;
  // multiple_inputs (the harness's newer spelling of what it infers): the
  // choices are contexts and doc_to_text the gold one's index; nullopt: as
  // the harness infers it, from whether the first scored document's
  // doc_to_text is an index.
  std::optional<bool> multiple_inputs;
  std::vector<std::string> tags;   // tag: the tag names a group's task list may use
  nlohmann::ordered_json version;  // metadata.version, or null
  nlohmann::ordered_json raw;      // the YAML as read, for the results' "configs"

  bool has_choices() const { return doc_to_choice || choice_list; }
  // The split the documents are scored on: test, else validation.
  const std::string& eval_split() const;
  // Few-shot examples come from fewshot_split, else training, validation, test.
  const std::string& fewshot_docs_split() const;
  // The harness removes the scored document from its few-shot draw (and draws
  // one more) when fewshot_split == test_split, both possibly unset.
  bool fewshot_excludes_doc() const { return fewshot_split == test_split; }
};

// Reads a task YAML. nk::Error naming the file and key for malformed YAML, a
// missing task or template, an unknown or unsupported key, an unknown output
// type, metric or filter function, or a value of the wrong kind.
TaskConfig load_task_config(const std::string& path);

// The same from a task's keys as read_yaml_json gives them (a task file's,
// or a definition inline in a group's task list, merged over the task it
// overrides); `where` names it in every message ("FILE", "FILE: task[i]").
TaskConfig task_config_from_json(const nlohmann::ordered_json& keys, const std::string& where);

// A YAML file as JSON, every scalar a string (a task's readers convert what
// they need, so a number in a template stays the text it was written as).
// nk::Error naming the file (and line) when it cannot be read or parsed, and
// for a `!function` (Python) anywhere. `what`: "task" or "group", for the
// message.
nlohmann::ordered_json read_yaml_json(const std::string& path, const char* what);
// The same for a node of a YAML already parsed, `where` naming it.
nlohmann::ordered_json yaml_json(const YAML::Node& node, const std::string& where);

// The metrics the harness computes for an output type when metric_list is
// absent, with their aggregations.
std::vector<MetricSpec> default_metrics(const std::string& output_type);

}  // namespace nk
