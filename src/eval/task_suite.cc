#include "eval/task_suite.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "core/error.h"
#include "core/log.h"

#ifndef NK_DEFAULT_TASKS_DIR
#define NK_DEFAULT_TASKS_DIR "configs/eval_tasks"
#endif

namespace nk {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

// The names the YAMLs below a folder define: task and group names to their
// file, tag names to their tasks' files. Files that do not parse are left
// out here (naming one by its file name still reports its error).
struct NameIndex {
  std::map<std::string, std::vector<std::string>> defined, tags;

  explicit NameIndex(const fs::path& root) {
    if (!fs::is_directory(root)) return;
    std::vector<fs::path> files;
    for (const auto& e : fs::recursive_directory_iterator(root))
      if (e.path().extension() == ".yaml" || e.path().extension() == ".yml")
        files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      YAML::Node n;
      try {
        n = YAML::LoadFile(f.string());
      } catch (const YAML::Exception&) {
        continue;
      }
      if (!n.IsMap()) continue;
      const bool group = n["group"] && n["task"] && n["task"].IsSequence();
      const YAML::Node name = group ? n["group"] : n["task"];
      if (name && name.IsScalar()) defined[name.Scalar()].push_back(f.string());
      if (!group && n["tag"]) {
        if (n["tag"].IsScalar()) tags[n["tag"].Scalar()].push_back(f.string());
        if (n["tag"].IsSequence())
          for (const auto& t : n["tag"])
            if (t.IsScalar()) tags[t.Scalar()].push_back(f.string());
      }
    }
  }
};

// A group's own keys, which an inline override of the group cannot change
// here (the rest go to every task below it).
const std::set<std::string> kGroupKeys = {"group", "group_alias", "aggregate_metric_list",
                                          "metadata"};

// `base` with `update`'s keys over it (Python's {**base, **update}).
Json merged(Json base, const Json& update) {
  if (update.is_object())
    for (auto it = update.begin(); it != update.end(); ++it) base[it.key()] = it.value();
  return base;
}

struct Builder {
  fs::path root;
  std::string what;
  NameIndex index;
  TaskSuite suite;
  std::map<std::string, int64_t> task_at, group_at;  // by file (and the keys over it)
  std::vector<std::string> open;                     // groups being expanded

  std::string display(const SuiteNode& n) const {
    return n.task >= 0 ? suite.tasks[size_t(n.task)].task : suite.groups[size_t(n.group)].group;
  }

  // A task once per definition: its file (or group entry) and the keys a
  // group's inline entry put over it. Two definitions of one name are an
  // error (their results would share a key).
  SuiteNode add_task(const std::string& key, const std::function<TaskConfig()>& load) {
    auto it = task_at.find(key);
    if (it == task_at.end()) {
      TaskConfig c = load();
      for (const TaskConfig& t : suite.tasks)
        if (t.task == c.task)
          fail(
              "{}: task '{}' is defined twice in this evaluation, differently: by {} and by {} "
              "(results are keyed by the task's name; evaluate one of them, or give one another "
              "name)",
              what, c.task, t.file, c.file);
      suite.tasks.push_back(std::move(c));
      it = task_at.emplace(key, int64_t(suite.tasks.size()) - 1).first;
    }
    return SuiteNode{it->second, -1, {}};
  }

  SuiteNode task_node(const std::string& file, const Json& update) {
    if (update.is_null()) return add_task(file, [&] { return load_task_config(file); });
    return add_task(file + "\n" + update.dump(), [&] {
      return task_config_from_json(merged(read_yaml_json(file, "task"), update),
                                   fmt::format("{} (with {})", file, update.dump()));
    });
  }

  // A group file's node: its own keys under those an enclosing inline entry
  // puts over it (the harness's {**group_config, **update_config}).
  SuiteNode group_node(const std::string& file, const Json& update) {
    GroupConfig g = load_group_config(file);
    const Json keys = merged(g.update, update);
    return group_node_of(std::move(g), update.is_null() ? file : file + "\n" + update.dump(), keys);
  }

  // A group's node: its entries with `update` over their tasks; `key`
  // tells one definition from another.
  SuiteNode group_node_of(GroupConfig g, const std::string& key, const Json& update) {
    const std::string file = g.file;
    if (std::find(open.begin(), open.end(), g.group) != open.end())
      fail("{}: task: group '{}' holds itself (through {})", file, g.group,
           fmt::join(open, " -> "));
    open.push_back(g.group);
    SuiteNode node;
    std::vector<std::string> overridden;  // the harness's task_group_map of this group
    for (size_t i = 0; i < g.tasks.size(); ++i) {
      const GroupEntry& e = g.tasks[i];
      if (e.group) {  // defined in place: its own keys over its tasks, the enclosing ones dropped
        node.children.push_back(group_node_of(*e.group, e.group->file, e.group->update));
        continue;
      }
      const std::string where = e.config.is_null() ? fmt::format("{}: task: '{}'", file, e.name)
                                                   : fmt::format("{}: task[{}]", file, i);
      // A name under keys the group puts over its tasks loads as the inline
      // entry of those keys (the harness's {"task": name, **update_config}),
      // so it counts among the group's overridden names.
      const bool as_inline =
          e.config.is_null() && !update.is_null() && !locate(e.name, where).files.empty();
      const GroupEntry named{e.name, Json{{"task", e.name}}, nullptr};
      std::vector<SuiteNode> got = as_inline ? inline_entry(named, where, update, overridden)
                                   : e.config.is_null()
                                       ? resolve(e.name, where, update)
                                       : inline_entry(e, where, update, overridden);
      for (SuiteNode& c : got) node.children.push_back(std::move(c));
    }
    open.pop_back();
    std::sort(node.children.begin(), node.children.end(),
              [&](const SuiteNode& a, const SuiteNode& b) { return display(a) < display(b); });
    auto it = group_at.find(key);
    if (it == group_at.end()) {
      suite.groups.push_back(std::move(g));
      it = group_at.emplace(key, int64_t(suite.groups.size()) - 1).first;
    }
    node.group = it->second;
    return node;
  }

  // An inline entry of a group's task list, as the harness's TaskManager
  // loads one: its keys (under those the enclosing groups put over it) go
  // over every task of the group or tag it names, or over the task it names
  // (renamed NAME-k when the group already overrode k tasks whose names
  // start so), or define a new task when nothing has its name.
  std::vector<SuiteNode> inline_entry(const GroupEntry& e, const std::string& where,
                                      const Json& update, std::vector<std::string>& overridden) {
    Json keys = merged(e.config, update);
    keys.erase("task");
    const Found f = locate(e.name, where);
    if (f.files.empty()) {
      Json def = keys;
      def["task"] = e.name;
      return {
          add_task(where + "\n" + def.dump(), [&] { return task_config_from_json(def, where); })};
    }
    if (!f.several && is_group_file(f.files[0])) {
      for (auto it = keys.begin(); it != keys.end(); ++it)
        if (kGroupKeys.count(it.key()))
          fail(
              "{}: {}: overriding a group's own key inline is not supported (only the keys of "
              "the tasks below it)",
              where, it.key());
      return {group_node(f.files[0], keys)};
    }
    if (f.several) {
      std::vector<SuiteNode> out;
      for (const std::string& file : f.files) out.push_back(task_node(file, keys));
      return out;
    }
    std::string name = e.name;
    const auto dups = std::count_if(overridden.begin(), overridden.end(),
                                    [&](const std::string& n) { return n.starts_with(e.name); });
    if (dups > 0) name = fmt::format("{}-{}", e.name, dups);
    overridden.push_back(name);
    Json def = merged(read_yaml_json(f.files[0], "task"), keys);
    def["task"] = name;
    return {add_task(where + "\n" + def.dump(), [&] {
      TaskConfig c = task_config_from_json(def, fmt::format("{} (over {})", where, f.files[0]));
      c.data_name = e.name;
      return c;
    })};
  }

  // Where a name is defined: one file (a task or a group), or a tag's or a
  // folder's task files (several); no files when nowhere.
  struct Found {
    std::vector<std::string> files;
    bool several = false;
  };
  Found locate(const std::string& name, const std::string& where) {
    if (name.ends_with(".yaml") || name.ends_with(".yml")) return {{name}, false};
    std::vector<std::string> by_file;
    if (fs::is_directory(root))
      for (const auto& e : fs::recursive_directory_iterator(root))
        if (e.path().filename() == name + ".yaml") by_file.push_back(e.path().string());
    if (by_file.size() > 1)
      fail("{}: '{}' is defined twice under {}: {}", where, name, root.string(),
           fmt::join(by_file, ", "));
    if (by_file.size() == 1) return {by_file, false};
    if (auto it = index.defined.find(name); it != index.defined.end()) {
      if (it->second.size() > 1)
        fail("{}: '{}' is defined twice under {}: {}", where, name, root.string(),
             fmt::join(it->second, ", "));
      return {{it->second[0]}, false};
    }
    if (auto it = index.tags.find(name); it != index.tags.end()) return {it->second, true};
    if (fs::is_directory(root / name)) {  // a folder: every task file in it
      std::vector<std::string> files;
      for (const auto& e : fs::directory_iterator(root / name))
        if (e.path().extension() == ".yaml" && !is_group_file(e.path().string()))
          files.push_back(e.path().string());
      std::sort(files.begin(), files.end());
      if (!files.empty()) return {files, true};
    }
    return {};
  }

  // The nodes a name stands for (one, or a tag's or folder's tasks), with
  // the keys enclosing groups' inline entries put over its tasks.
  std::vector<SuiteNode> resolve(const std::string& name, const std::string& where,
                                 const Json& update = nullptr) {
    const Found f = locate(name, where);
    if (f.files.empty())
      fail(
          "{}: no task, group or tag '{}' (no {}.yaml, no YAML naming it, no folder {} under "
          "{}; give a path to a task YAML, or the task folder)",
          where, name, name, name, root.string());
    if (!f.several)
      return {is_group_file(f.files[0]) ? group_node(f.files[0], update)
                                        : task_node(f.files[0], update)};
    std::vector<SuiteNode> out;
    for (const std::string& file : f.files) out.push_back(task_node(file, update));
    return out;
  }
};

void leaves(const SuiteNode& n, std::vector<int64_t>& out) {
  if (n.task >= 0) {
    if (std::find(out.begin(), out.end(), n.task) == out.end()) out.push_back(n.task);
    return;
  }
  for (const SuiteNode& c : n.children) leaves(c, out);
}

void find_groups(const SuiteNode& n, std::map<int64_t, const SuiteNode*>& out) {
  if (n.group >= 0) out.emplace(n.group, &n);
  for (const SuiteNode& c : n.children) find_groups(c, out);
}

}  // namespace

TaskSuite load_suite(const std::vector<std::string>& names, const std::string& task_dir,
                     const std::string& what) {
  const fs::path root = task_dir.empty() ? NK_DEFAULT_TASKS_DIR : task_dir;
  Builder b{root, what, NameIndex(root), {}, {}, {}, {}};
  for (const std::string& name : names)
    for (SuiteNode& n : b.resolve(name, what)) b.suite.roots.push_back(std::move(n));
  if (b.suite.tasks.empty()) fail("{}: no tasks", what);
  return std::move(b.suite);
}

std::vector<GroupResult> aggregate_groups(const TaskSuite& suite,
                                          const std::vector<TaskResult>& results) {
  std::map<int64_t, const SuiteNode*> nodes;
  for (const SuiteNode& r : suite.roots) find_groups(r, nodes);
  std::vector<GroupResult> out;
  for (size_t gi = 0; gi < suite.groups.size(); ++gi) {
    const GroupConfig& g = suite.groups[gi];
    const SuiteNode& node = *nodes.at(int64_t(gi));
    GroupResult gr;
    gr.group = g.group;
    for (const SuiteNode& c : node.children)
      gr.subtasks.push_back(c.task >= 0 ? suite.tasks[size_t(c.task)].task
                                        : suite.groups[size_t(c.group)].group);
    std::vector<int64_t> tasks;
    leaves(node, tasks);
    for (int64_t t : tasks) gr.samples += results[size_t(t)].n_docs;
    if (g.aggregate)
      for (size_t a = 0; a < g.aggregate->size(); ++a) {
        const AggregateMetric& am = (*g.aggregate)[a];
        for (const std::string& filter : am.filters) {
          const std::string key = am.metric + "," + filter;
          std::vector<double> values;
          std::vector<std::optional<double>> stderrs;
          std::vector<int64_t> sizes;
          bool higher = true;
          for (int64_t t : tasks)
            for (const MetricValue& v : results[size_t(t)].metrics)
              if (v.key == key) {
                values.push_back(v.value);
                stderrs.push_back(v.stderr_);
                sizes.push_back(results[size_t(t)].n_docs);
                higher = v.higher_is_better;
              }
          if (values.empty())
            fail("{}: aggregate_metric_list[{}]: none of the group's tasks reports '{}'", g.file, a,
                 key);
          const Pooled p = aggregate_metric(values, stderrs, sizes, am.weight_by_size);
          gr.metrics.push_back(MetricValue{key, p.value, p.stderr_, higher});
        }
      }
    out.push_back(std::move(gr));
  }
  return out;
}

SuiteResult run_suite(const TaskSuite& suite, EvalModel& model, const TaskRunOptions& opt) {
  SuiteResult r;
  for (const TaskConfig& c : suite.tasks) {
    NK_INFO("eval: task {} ({}, {})", c.task, c.output_type, c.file);
    const auto t0 = std::chrono::steady_clock::now();
    r.tasks.push_back(run_task(c, model, opt));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    NK_INFO("eval: task {}: {} documents in {:.2f} s ({:.3f} documents/s)", c.task,
            r.tasks.back().n_docs, s, double(r.tasks.back().n_docs) / s);
  }
  r.groups = aggregate_groups(suite, r.tasks);
  return r;
}

std::vector<std::pair<std::string, double>> suite_figures(const TaskSuite& suite,
                                                          const SuiteResult& r) {
  std::vector<std::pair<std::string, double>> out;
  auto add = [&](const std::string& name, const std::vector<MetricValue>& metrics) {
    for (const MetricValue& v : metrics) {
      const size_t comma = v.key.find(',');
      const std::string filter = v.key.substr(comma + 1);
      out.emplace_back(fmt::format("eval/{}/{}{}", name, v.key.substr(0, comma),
                                   filter == "none" ? "" : "/" + filter),
                       v.value);
    }
  };
  for (size_t i = 0; i < suite.tasks.size(); ++i) add(suite.tasks[i].task, r.tasks[i].metrics);
  for (size_t i = 0; i < suite.groups.size(); ++i) add(suite.groups[i].group, r.groups[i].metrics);
  return out;
}

}  // namespace nk
