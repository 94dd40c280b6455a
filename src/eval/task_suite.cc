#include "eval/task_suite.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "core/log.h"

#ifndef NK_DEFAULT_TASKS_DIR
#define NK_DEFAULT_TASKS_DIR "configs/eval_tasks"
#endif

namespace nk {

namespace fs = std::filesystem;

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

struct Builder {
  fs::path root;
  std::string what;
  NameIndex index;
  TaskSuite suite;
  std::map<std::string, int64_t> task_at, group_at;  // by file
  std::vector<std::string> open;                     // groups being expanded

  std::string display(const SuiteNode& n) const {
    return n.task >= 0 ? suite.tasks[size_t(n.task)].task : suite.groups[size_t(n.group)].group;
  }

  SuiteNode task_node(const std::string& file) {
    auto it = task_at.find(file);
    if (it == task_at.end()) {
      suite.tasks.push_back(load_task_config(file));
      it = task_at.emplace(file, int64_t(suite.tasks.size()) - 1).first;
    }
    return SuiteNode{it->second, -1, {}};
  }

  SuiteNode group_node(const std::string& file) {
    GroupConfig g = load_group_config(file);
    if (std::find(open.begin(), open.end(), g.group) != open.end())
      fail("{}: task: group '{}' holds itself (through {})", file, g.group,
           fmt::join(open, " -> "));
    open.push_back(g.group);
    SuiteNode node;
    for (const std::string& child : g.tasks)
      for (SuiteNode& c : resolve(child, fmt::format("{}: task: '{}'", file, child)))
        node.children.push_back(std::move(c));
    open.pop_back();
    std::sort(node.children.begin(), node.children.end(),
              [&](const SuiteNode& a, const SuiteNode& b) { return display(a) < display(b); });
    auto it = group_at.find(file);
    if (it == group_at.end()) {
      suite.groups.push_back(std::move(g));
      it = group_at.emplace(file, int64_t(suite.groups.size()) - 1).first;
    }
    node.group = it->second;
    return node;
  }

  SuiteNode file_node(const std::string& file) {
    return is_group_file(file) ? group_node(file) : task_node(file);
  }

  // The nodes a name stands for (one, or a tag's or folder's tasks).
  std::vector<SuiteNode> resolve(const std::string& name, const std::string& where) {
    if (name.ends_with(".yaml") || name.ends_with(".yml")) return {file_node(name)};
    std::vector<std::string> by_file;
    if (fs::is_directory(root))
      for (const auto& e : fs::recursive_directory_iterator(root))
        if (e.path().filename() == name + ".yaml") by_file.push_back(e.path().string());
    if (by_file.size() > 1)
      fail("{}: '{}' is defined twice under {}: {}", where, name, root.string(),
           fmt::join(by_file, ", "));
    if (by_file.size() == 1) return {file_node(by_file[0])};
    if (auto it = index.defined.find(name); it != index.defined.end()) {
      if (it->second.size() > 1)
        fail("{}: '{}' is defined twice under {}: {}", where, name, root.string(),
             fmt::join(it->second, ", "));
      return {file_node(it->second[0])};
    }
    if (auto it = index.tags.find(name); it != index.tags.end()) {
      std::vector<SuiteNode> out;
      for (const std::string& f : it->second) out.push_back(task_node(f));
      return out;
    }
    if (fs::is_directory(root / name)) {  // a folder: every task file in it
      std::vector<std::string> files;
      for (const auto& e : fs::directory_iterator(root / name))
        if (e.path().extension() == ".yaml" && !is_group_file(e.path().string()))
          files.push_back(e.path().string());
      std::sort(files.begin(), files.end());
      std::vector<SuiteNode> out;
      for (const std::string& f : files) out.push_back(task_node(f));
      if (!out.empty()) return out;
    }
    fail(
        "{}: no task, group or tag '{}' (no {}.yaml, no YAML naming it, no folder {} under "
        "{}; give a path to a task YAML, or the task folder)",
        where, name, name, name, root.string());
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
