#include "eval/task_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.h"

namespace nk {

using Json = nlohmann::ordered_json;

// YAML as JSON with every scalar a string: the readers below convert what
// they need, so a number in a template field stays the text it was written as.
Json yaml_json(const YAML::Node& n, const std::string& where) {
  if (n.Tag() == "!function")
    fail("{}: a !function (Python code) is not supported; write the template in Jinja", where);
  switch (n.Type()) {
    case YAML::NodeType::Sequence: {
      Json a = Json::array();
      for (size_t i = 0; i < n.size(); ++i)
        a.push_back(yaml_json(n[i], fmt::format("{}[{}]", where, i)));
      return a;
    }
    case YAML::NodeType::Map: {
      Json o = Json::object();
      for (auto it = n.begin(); it != n.end(); ++it) {
        const std::string k = it->first.as<std::string>();
        o[k] = yaml_json(it->second, where + "." + k);
      }
      return o;
    }
    case YAML::NodeType::Scalar:
      return n.Scalar();
    default:
      return nullptr;
  }
}

Json read_yaml_json(const std::string& path, const char* what) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    fail("{}: cannot read the {} file", path, what);
  } catch (const YAML::Exception& e) {
    fail("{}:{}:{}: malformed YAML: {}", path, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
  return yaml_json(root, path);
}

namespace {

struct Reader {
  const std::string& file;
  [[noreturn]] void bad(const std::string& key, const std::string& why) const {
    fail("{}: {}: {}", file, key, why);
  }
  std::string str(const Json& j, const std::string& key) const {
    if (!j.is_string()) bad(key, "must be a string");
    return j.get<std::string>();
  }
  int64_t integer(const Json& j, const std::string& key) const {
    const std::string s = str(j, key);
    try {
      size_t used = 0;
      const long long v = std::stoll(s, &used);
      if (used == s.size()) return v;
    } catch (const std::exception&) {
    }
    bad(key, fmt::format("must be an integer, got '{}'", s));
  }
  double number(const Json& j, const std::string& key) const {
    const std::string s = str(j, key);
    try {
      size_t used = 0;
      const double v = std::stod(s, &used);
      if (used == s.size() && std::isfinite(v)) return v;
    } catch (const std::exception&) {
    }
    bad(key, fmt::format("must be a number, got '{}'", s));
  }
  bool boolean(const Json& j, const std::string& key) const {
    const std::string s = str(j, key);
    if (s == "true" || s == "True") return true;
    if (s == "false" || s == "False") return false;
    bad(key, fmt::format("must be true or false, got '{}'", s));
  }
  std::vector<std::string> strings(const Json& j, const std::string& key) const {
    if (j.is_string()) return {j.get<std::string>()};
    if (!j.is_array()) bad(key, "must be a string or a list of strings");
    std::vector<std::string> out;
    for (size_t i = 0; i < j.size(); ++i) out.push_back(str(j[i], fmt::format("{}[{}]", key, i)));
    return out;
  }
  void only(const Json& o, const std::string& key, const std::set<std::string>& known) const {
    if (!o.is_object()) bad(key, "must be a mapping");
    for (auto it = o.begin(); it != o.end(); ++it)
      if (!known.count(it.key()))
        bad(key + "." + it.key(), fmt::format("unknown key (known: {})", fmt::join(known, ", ")));
  }
};

const std::set<std::string> kOutputTypes = {"multiple_choice", "loglikelihood",
                                            "loglikelihood_rolling", "generate_until"};

// metric -> (output types, aggregation, higher is better)
struct MetricInfo {
  std::set<std::string> types;
  const char* aggregation;
  bool higher;
};
const std::map<std::string, MetricInfo>& metric_table() {
  static const std::map<std::string, MetricInfo> t = {
      {"acc", {{"multiple_choice", "loglikelihood"}, "mean", true}},
      {"acc_norm", {{"multiple_choice"}, "mean", true}},
      {"acc_bytes", {{"multiple_choice"}, "mean", true}},
      {"acc_mutual_info", {{"multiple_choice"}, "mean", true}},
      {"perplexity", {{"loglikelihood"}, "perplexity", false}},
      {"word_perplexity", {{"loglikelihood_rolling"}, "weighted_perplexity", false}},
      {"byte_perplexity", {{"loglikelihood_rolling"}, "weighted_perplexity", false}},
      {"bits_per_byte", {{"loglikelihood_rolling"}, "bits_per_byte", false}},
      {"exact_match", {{"generate_until"}, "mean", true}},
  };
  return t;
}

MetricSpec metric_spec(const std::string& name) {
  const MetricInfo& m = metric_table().at(name);
  MetricSpec s;
  s.metric = name;
  s.aggregation = m.aggregation;
  s.higher_is_better = m.higher;
  return s;
}

}  // namespace

const std::string& TaskConfig::eval_split() const {
  if (test_split) return *test_split;
  if (validation_split) return *validation_split;
  fail("{}: the task has neither test_split nor validation_split", file);
}

const std::string& TaskConfig::fewshot_docs_split() const {
  if (fewshot_split) return *fewshot_split;
  if (training_split) return *training_split;
  if (validation_split) return *validation_split;
  return eval_split();
}

std::vector<MetricSpec> default_metrics(const std::string& output_type) {
  if (output_type == "multiple_choice") return {metric_spec("acc"), metric_spec("acc_norm")};
  if (output_type == "loglikelihood") return {metric_spec("perplexity"), metric_spec("acc")};
  if (output_type == "loglikelihood_rolling")
    return {metric_spec("word_perplexity"), metric_spec("byte_perplexity"),
            metric_spec("bits_per_byte")};
  return {metric_spec("exact_match")};
}

TaskConfig load_task_config(const std::string& path) {
  return task_config_from_json(read_yaml_json(path, "task"), path);
}

TaskConfig task_config_from_json(const Json& j, const std::string& path) {
  TaskConfig c;
  c.file = path;
  const Reader r{path};
  if (!j.is_object()) fail("{}: a task file is a mapping of keys (task, doc_to_text, ...)", path);
  c.raw = j;
  static const std::set<std::string> unsupported = {
      "process_docs", "process_results", "include",      "group",
      "use_prompt",   "doc_to_image",    "doc_to_audio", "unsafe_code"};
  static const std::set<std::string> known = {"task",
                                              "tag",
                                              "dataset_path",
                                              "dataset_name",
                                              "dataset_kwargs",
                                              "training_split",
                                              "validation_split",
                                              "test_split",
                                              "fewshot_split",
                                              "doc_to_text",
                                              "doc_to_target",
                                              "doc_to_choice",
                                              "description",
                                              "target_delimiter",
                                              "fewshot_delimiter",
                                              "num_fewshot",
                                              "fewshot_config",
                                              "output_type",
                                              "metric_list",
                                              "filter_list",
                                              "generation_kwargs",
                                              "metadata",
                                              "should_decontaminate",
                                              "doc_to_decontamination_query",
                                              "repeats",
                                              "task_alias",
                                              "multiple_inputs",
                                              "gen_prefix"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (unsupported.count(it.key()))
      r.bad(it.key(),
            "not supported by Nekton's harness (it runs no Python; give the documents "
            "already processed and the templates in Jinja)");
    if (!known.count(it.key())) r.bad(it.key(), "unknown key");
  }
  auto opt_str = [&](const char* key) -> std::optional<std::string> {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    return r.str(j[key], key);
  };
  if (!j.contains("task")) r.bad("task", "missing (the task's name)");
  c.task = r.str(j["task"], "task");
  c.data_name = c.task;
  c.alias = opt_str("task_alias").value_or(c.task);
  if (j.contains("tag")) c.tags = r.strings(j["tag"], "tag");
  if (j.contains("multiple_inputs"))
    c.multiple_inputs = r.boolean(j["multiple_inputs"], "multiple_inputs");
  c.dataset_path = opt_str("dataset_path").value_or("");
  c.dataset_name = opt_str("dataset_name").value_or("");
  if (j.contains("dataset_kwargs")) {
    const Json& kw = j["dataset_kwargs"];
    if (kw.is_object() && kw.contains("data_files")) {
      const Json& df = kw["data_files"];
      if (!df.is_object()) r.bad("dataset_kwargs.data_files", "must be a mapping of split to file");
      for (auto it = df.begin(); it != df.end(); ++it)
        c.data_files[it.key()] = r.str(it.value(), "dataset_kwargs.data_files." + it.key());
    }
  }
  c.training_split = opt_str("training_split");
  c.validation_split = opt_str("validation_split");
  c.test_split = opt_str("test_split");
  c.fewshot_split = opt_str("fewshot_split");
  if (!c.test_split && !c.validation_split)
    r.bad("test_split", "missing, as is validation_split: no split to score");
  for (const char* key : {"doc_to_text", "doc_to_target"})
    if (!j.contains(key)) r.bad(key, "missing");
  c.doc_to_text = r.str(j["doc_to_text"], "doc_to_text");
  c.doc_to_target = r.str(j["doc_to_target"], "doc_to_target");
  if (j.contains("doc_to_choice")) {
    const Json& ch = j["doc_to_choice"];
    if (ch.is_string())
      c.doc_to_choice = ch.get<std::string>();
    else if (ch.is_array())
      c.choice_list = r.strings(ch, "doc_to_choice");
    else if (ch.is_object()) {  // the harness takes a mapping's values
      std::vector<std::string> v;
      for (auto it = ch.begin(); it != ch.end(); ++it)
        v.push_back(r.str(it.value(), "doc_to_choice." + it.key()));
      c.choice_list = v;
    } else
      r.bad("doc_to_choice", "must be a field, a template or a list");
  }
  c.description = opt_str("description").value_or("");
  c.gen_prefix = opt_str("gen_prefix");
  c.target_delimiter = opt_str("target_delimiter").value_or(" ");
  c.fewshot_delimiter = opt_str("fewshot_delimiter").value_or("\n\n");
  if (j.contains("num_fewshot") && !j["num_fewshot"].is_null()) {
    c.num_fewshot = r.integer(j["num_fewshot"], "num_fewshot");
    if (c.num_fewshot < 0) r.bad("num_fewshot", "must be >= 0");
  }
  if (j.contains("fewshot_config")) {
    const Json& f = j["fewshot_config"];
    r.only(f, "fewshot_config", {"sampler"});
    if (f.contains("sampler")) c.sampler = r.str(f["sampler"], "fewshot_config.sampler");
    if (c.sampler != "default" && c.sampler != "first_n")
      r.bad("fewshot_config.sampler", fmt::format("'{}' is not default or first_n", c.sampler));
  }
  c.output_type = opt_str("output_type").value_or("generate_until");
  if (!kOutputTypes.count(c.output_type))
    r.bad("output_type",
          fmt::format("'{}' is not one of {}", c.output_type, fmt::join(kOutputTypes, ", ")));
  if (j.contains("repeats")) {
    c.repeats = r.integer(j["repeats"], "repeats");
    if (c.repeats < 1) r.bad("repeats", fmt::format("must be >= 1, got {}", c.repeats));
    if (c.repeats > 1 && c.output_type != "generate_until")
      r.bad("repeats", fmt::format("{} with output_type {}: only generate_until gives several "
                                   "answers per document",
                                   c.repeats, c.output_type));
  }
  if (c.output_type == "multiple_choice" && !c.has_choices())
    r.bad("doc_to_choice", "missing: a multiple_choice task needs its choices");
  if (c.multiple_inputs.value_or(false) && c.output_type != "multiple_choice")
    r.bad("multiple_inputs", "only a multiple_choice task has multiple inputs (contexts)");
  if (j.contains("metric_list")) {
    const Json& ml = j["metric_list"];
    if (!ml.is_array()) r.bad("metric_list", "must be a list");
    for (size_t i = 0; i < ml.size(); ++i) {
      const std::string key = fmt::format("metric_list[{}]", i);
      const Json& m = ml[i];
      r.only(m, key,
             {"metric", "aggregation", "higher_is_better", "ignore_case", "ignore_punctuation",
              "ignore_numbers", "regexes_to_ignore"});
      if (!m.contains("metric")) r.bad(key + ".metric", "missing");
      const std::string name = r.str(m["metric"], key + ".metric");
      auto it = metric_table().find(name);
      if (it == metric_table().end() || !it->second.types.count(c.output_type))
        r.bad(key + ".metric",
              fmt::format("'{}' is not a metric of output type {}", name, c.output_type));
      MetricSpec s = metric_spec(name);
      if (m.contains("aggregation")) {
        const std::string agg = r.str(m["aggregation"], key + ".aggregation");
        if (agg != s.aggregation)
          r.bad(key + ".aggregation",
                fmt::format("'{}': {} aggregates by {} only", agg, name, s.aggregation));
      }
      if (m.contains("higher_is_better"))
        s.higher_is_better = r.boolean(m["higher_is_better"], key + ".higher_is_better");
      if (m.contains("ignore_case"))
        s.ignore_case = r.boolean(m["ignore_case"], key + ".ignore_case");
      if (m.contains("ignore_punctuation"))
        s.ignore_punctuation = r.boolean(m["ignore_punctuation"], key + ".ignore_punctuation");
      if (m.contains("ignore_numbers"))
        s.ignore_numbers = r.boolean(m["ignore_numbers"], key + ".ignore_numbers");
      if (m.contains("regexes_to_ignore"))
        s.regexes_to_ignore = r.strings(m["regexes_to_ignore"], key + ".regexes_to_ignore");
      c.metrics.push_back(std::move(s));
    }
  } else {
    c.metrics = default_metrics(c.output_type);
  }
  if (j.contains("filter_list")) {
    const Json& fl = j["filter_list"];
    if (!fl.is_array()) r.bad("filter_list", "must be a list");
    for (size_t i = 0; i < fl.size(); ++i) {
      const std::string key = fmt::format("filter_list[{}]", i);
      r.only(fl[i], key, {"name", "filter"});
      FilterSpec f;
      if (!fl[i].contains("name")) r.bad(key + ".name", "missing");
      f.name = r.str(fl[i]["name"], key + ".name");
      if (!fl[i].contains("filter") || !fl[i]["filter"].is_array())
        r.bad(key + ".filter", "missing or not a list of functions");
      const Json& steps = fl[i]["filter"];
      for (size_t k = 0; k < steps.size(); ++k) {
        const std::string sk = fmt::format("{}.filter[{}]", key, k);
        r.only(steps[k], sk, {"function", "regex_pattern", "group_select", "fallback", "k"});
        FilterStep st;
        if (!steps[k].contains("function")) r.bad(sk + ".function", "missing");
        st.function = r.str(steps[k]["function"], sk + ".function");
        static const std::set<std::string> fns = {
            "regex",     "take_first", "take_first_k",     "majority_vote",
            "lowercase", "uppercase",  "remove_whitespace"};
        if (!fns.count(st.function))
          r.bad(sk + ".function",
                fmt::format("'{}' is not one of {}", st.function, fmt::join(fns, ", ")));
        if (st.function == "take_first_k") {
          if (!steps[k].contains("k")) r.bad(sk + ".k", "missing: take_first_k keeps the first k");
          st.k = r.integer(steps[k]["k"], sk + ".k");
          if (st.k < 1) r.bad(sk + ".k", fmt::format("must be >= 1, got {}", st.k));
        }
        if (steps[k].contains("regex_pattern"))
          st.regex_pattern = r.str(steps[k]["regex_pattern"], sk + ".regex_pattern");
        if (steps[k].contains("group_select"))
          st.group_select = r.integer(steps[k]["group_select"], sk + ".group_select");
        if (steps[k].contains("fallback"))
          st.fallback = r.str(steps[k]["fallback"], sk + ".fallback");
        f.steps.push_back(std::move(st));
      }
      c.filters.push_back(std::move(f));
    }
  }
  if (c.filters.empty()) c.filters.push_back(FilterSpec{"none", {FilterStep{"take_first"}}});
  c.until = {c.fewshot_delimiter};
  if (j.contains("generation_kwargs")) {
    const Json& g = j["generation_kwargs"];
    r.only(g, "generation_kwargs",
           {"until", "max_gen_toks", "do_sample", "temperature", "top_p", "top_k"});
    if (g.contains("until")) c.until = r.strings(g["until"], "generation_kwargs.until");
    if (g.contains("max_gen_toks")) {
      c.max_gen_toks = r.integer(g["max_gen_toks"], "generation_kwargs.max_gen_toks");
      if (c.max_gen_toks < 1) r.bad("generation_kwargs.max_gen_toks", "must be >= 1");
    }
    if (g.contains("do_sample"))
      c.do_sample = r.boolean(g["do_sample"], "generation_kwargs.do_sample");
    if (g.contains("temperature")) {
      c.temperature = r.number(g["temperature"], "generation_kwargs.temperature");
      if (c.temperature < 0) r.bad("generation_kwargs.temperature", "must be >= 0");
    }
    if (g.contains("top_p")) {
      c.top_p = r.number(g["top_p"], "generation_kwargs.top_p");
      if (!(c.top_p > 0 && c.top_p <= 1)) r.bad("generation_kwargs.top_p", "must be in (0, 1]");
    }
    if (g.contains("top_k")) {
      c.top_k = r.integer(g["top_k"], "generation_kwargs.top_k");
      if (c.top_k < 0) r.bad("generation_kwargs.top_k", "must be >= 0 (0: off)");
    }
    // As Hugging Face's generate: sampling needs a temperature above 0; a
    // temperature without do_sample would leave greedy or sampled to the
    // model's generation_config, so it is refused rather than guessed.
    if (c.do_sample && c.temperature <= 0)
      r.bad("generation_kwargs.temperature",
            "do_sample: true needs a temperature > 0 (the harness passes 0 when none is "
            "given, which Hugging Face's generate refuses)");
    if (!c.do_sample && c.temperature > 0)
      r.bad("generation_kwargs.temperature",
            fmt::format("{} without do_sample: true: add do_sample: true to sample, or set 0 for "
                        "greedy answers",
                        c.temperature));
  }
  // Each filter must leave one answer per document to score.
  if (c.output_type == "generate_until")
    for (size_t i = 0; i < c.filters.size(); ++i) {
      const std::string key = fmt::format("filter_list[{}]", i);
      int64_t answers = c.repeats;
      for (size_t k = 0; k < c.filters[i].steps.size(); ++k) {
        const FilterStep& st = c.filters[i].steps[k];
        if (st.function == "take_first" || st.function == "majority_vote") answers = 1;
        if (st.function == "take_first_k") {
          if (st.k > answers)
            r.bad(fmt::format("{}.filter[{}].k", key, k),
                  fmt::format("take_first_k {} of {} answer(s) per document (repeats {})", st.k,
                              answers, c.repeats));
          answers = st.k;
        }
      }
      if (answers != 1)
        r.bad(key + ".filter",
              fmt::format("leaves {} answers per document (repeats {}); end it with take_first "
                          "or majority_vote to score one",
                          answers, c.repeats));
    }
  if (j.contains("metadata") && j["metadata"].is_object() && j["metadata"].contains("version")) {
    const std::string v = r.str(j["metadata"]["version"], "metadata.version");
    try {
      c.version = std::stod(v);
    } catch (const std::exception&) {
      c.version = v;
    }
  }
  return c;
}

}  // namespace nk
