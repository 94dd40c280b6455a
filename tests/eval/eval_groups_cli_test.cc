// `nekton eval tasks` over groups against harness_reference.py: a group of
// a tag's tasks inside a group weighted by size, groups defined in place in
// another group's task list, a group's own task keys over its tasks, and the
// built-in mmlu; then the group definitions a user can get wrong, each named.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "eval_tasks_fixture.h"

namespace nk {
namespace {

using Json = nlohmann::ordered_json;
using test::contains;
using test::run_nekton;

// Groups: a group of a tag's tasks (plain mean) inside a group weighted by
// size, in a task folder of their own; then the built-in mmlu (four
// category groups over the 57 subjects' tags). Every group's value and
// pooled standard error against the reference's hand computation from its
// own per-task figures; the results' hierarchy (aliases, groups,
// group_subtasks) and the Groups table.
TEST_F(EvalTasksCli, GroupsMatchTheReference) {
  const std::string dir = d_.fresh("tasks").string();
  auto task = [&](const std::string& name, const std::string& extra, int n) {
    std::vector<Json> docs;
    for (int i = 0; i < n; ++i)
      docs.push_back(
          {{"q", words(4)}, {"opts", {words(1), words(2), words(1)}}, {"label", int(rng_() % 3)}});
    write_split(name, "test", docs);
    test::write_file(dir + "/" + name + ".yaml",
                     "task: " + name + "\n" + extra +
                         "output_type: multiple_choice\ntest_split: test\n"
                         "doc_to_text: \"{{q}}?\"\ndoc_to_target: label\ndoc_to_choice: opts\n");
  };
  task("t_a", "tag: pair_tasks\n", 5);
  task("t_b", "tag: [pair_tasks, other_tag]\n", 8);
  task("t_c", "", 3);
  test::write_file(dir + "/inner.yaml", R"(group: inner
task: [pair_tasks]
aggregate_metric_list:
  - metric: acc
    weight_by_size: false
  - metric: acc_norm
    aggregation: mean
metadata:
  version: 3
)");
  std::filesystem::create_directories(dir + "/groups");
  test::write_file(dir + "/groups/outer.yaml", R"(group: outer
group_alias: Outer
task:
  - t_c
  - inner
aggregate_metric_list:
  - metric: acc
    weight_by_size: true
    filter_list: [none]
)");
  const std::string out = d_ / "groups.json";
  auto r =
      run_nekton("eval tasks eval.model=" + random_ + " eval.task_dir=" + dir +
                 " eval.tasks=outer eval.data=" + data_ + " eval.write_out=100 eval.output=" + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "|Groups") && contains(r.out, "|Outer ") &&
              contains(r.out, "| - inner|") && contains(r.out, "|  - t_a"))
      << r.out;
  const Json res = Json::parse(test::read_file(out));
  EXPECT_EQ(res["results"]["outer"]["alias"], "Outer");
  EXPECT_EQ(res["results"]["inner"]["alias"], " - inner");
  EXPECT_EQ(res["results"]["t_b"]["alias"], "  - t_b");
  EXPECT_EQ(res["results"]["t_c"]["alias"], " - t_c");
  EXPECT_EQ(res["groups"]["inner"]["alias"], " - inner");
  EXPECT_EQ(res["group_subtasks"]["outer"], Json({"inner", "t_c"}));
  EXPECT_EQ(res["group_subtasks"]["inner"], Json({"t_a", "t_b"}));
  EXPECT_EQ(res["versions"]["inner"], 3.0);
  EXPECT_FALSE(res["groups"]["outer"].contains("acc_norm,none"));
  auto with_dir = [&](Json plan) {
    plan["task_dir"] = dir;
    return plan;
  };
  expect_reference(
      {{dir + "/t_a.yaml", random_}, {dir + "/t_b.yaml", random_}, {dir + "/t_c.yaml", random_}},
      out, with_dir({{"groups", {"outer", "inner"}}}));
  // A task of one document has no standard error ("N/A"), so neither has a
  // group over it.
  task("t_one", "", 1);
  test::write_file(dir + "/g_na.yaml",
                   "group: g_na\ntask: [t_a, t_one]\naggregate_metric_list:\n"
                   "  - metric: acc\n    weight_by_size: true\n");
  r = run_nekton("eval tasks eval.model=" + random_ + " eval.task_dir=" + dir +
                 " eval.tasks=g_na eval.data=" + data_ +
                 " eval.write_out=100 eval.output=" + (d_ / "na.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(Json::parse(test::read_file(d_ / "na.json"))["groups"]["g_na"]["acc_stderr,none"],
            "N/A");
  expect_reference({{dir + "/t_a.yaml", random_}, {dir + "/t_one.yaml", random_}}, d_ / "na.json",
                   with_dir({{"groups", {"g_na"}}}));
  // Inline entries of a group's task list, as the harness loads them: keys
  // over a task (twice: the second renamed t_a-1, its documents still
  // t_a's), over every task of a tag, and a new task defined in place.
  std::vector<Json> fresh;
  for (int i = 0; i < 4; ++i)
    fresh.push_back({{"q", words(3)}, {"opts", {words(1), words(2)}}, {"label", int(rng_() % 2)}});
  write_split("t_new", "test", fresh);
  test::write_file(dir + "/g_inline.yaml", R"(group: g_inline
task:
  - task: t_a
    num_fewshot: 1
  - task: t_a
    target_delimiter: ": "
  - task: other_tag
    description: "Choose.\n"
  - task: t_new
    output_type: multiple_choice
    test_split: test
    doc_to_text: "{{q}}!"
    doc_to_target: label
    doc_to_choice: opts
aggregate_metric_list:
  - metric: acc
)");
  // `group` evaluated into `out` (with the sample log), its results.
  auto run_group = [&](const std::string& group, const std::string& out) {
    const test::RunResult run = run_nekton(
        "eval tasks eval.model=" + random_ + " eval.task_dir=" + dir + " eval.tasks=" + group +
        " eval.data=" + data_ + " eval.write_out=100 eval.output=" + out);
    EXPECT_EQ(run.code, 0) << run.out;
    return run.code == 0 ? Json::parse(test::read_file(out)) : Json::object();
  };
  const std::string iout = d_ / "inline.json";
  const Json ires = run_group("g_inline", iout);
  EXPECT_EQ(ires["group_subtasks"]["g_inline"], Json({"t_a", "t_a-1", "t_b", "t_new"}));
  EXPECT_EQ(ires["n-shot"]["t_a"], 1);
  EXPECT_EQ(ires["configs"]["t_a-1"]["target_delimiter"], ": ");
  expect_reference(
      {}, iout,
      with_dir({{"groups", {"g_inline"}}, {"expand", {"g_inline"}}, {"expand_model", random_}}));
  // A group's own task keys go over every task below it; a group defined in
  // place puts its own over its tasks (the enclosing group's dropped there,
  // as the harness does), with its aggregate of them.
  test::write_file(dir + "/g_nested.yaml", R"(group: g_nested
description: "Q.\n"
task:
  - t_b
  - group: g_in
    group_alias: inner inline
    target_delimiter: ": "
    task:
      - t_a
      - task: t_c
        num_fewshot: 1
    aggregate_metric_list:
      - metric: acc
aggregate_metric_list:
  - metric: acc
)");
  const std::string nout = d_ / "nested.json";
  const Json nres = run_group("g_nested", nout);
  EXPECT_EQ(nres["group_subtasks"]["g_in"], Json({"t_a", "t_c"}));
  EXPECT_TRUE(contains(nres["group_subtasks"]["g_nested"].dump(), "g_in"))
      << nres["group_subtasks"].dump();
  EXPECT_EQ(nres["configs"]["t_b"]["description"], "Q.\n");
  EXPECT_EQ(nres["configs"]["t_a"]["target_delimiter"], ": ");
  EXPECT_NE(nres["configs"]["t_a"]["description"], "Q.\n");
  EXPECT_EQ(nres["n-shot"]["t_c"], 1);
  EXPECT_TRUE(nres["groups"]["g_in"].contains("acc,none"));
  expect_reference(
      {}, nout,
      with_dir(
          {{"groups", {"g_nested", "g_in"}}, {"expand", {"g_nested"}}, {"expand_model", random_}}));
  // A tag alone runs its tasks with no group row.
  r = run_nekton("eval tasks eval.model=" + random_ + " eval.task_dir=" + dir +
                 " eval.tasks=other_tag eval.data=" + data_ + " eval.output=" + (d_ / "tag.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(contains(r.out, "|Groups")) << r.out;
  EXPECT_TRUE(Json::parse(test::read_file(d_ / "tag.json"))["results"].contains("t_b"));

  // The built-in mmlu: 57 subjects of 2 to 4 documents.
  std::vector<std::pair<std::string, std::string>> subjects;
  for (const auto& e : std::filesystem::directory_iterator(kTasks + "mmlu")) {
    const std::string f = e.path().filename().string();
    if (!f.starts_with("mmlu_")) continue;
    const std::string name = f.substr(0, f.size() - 5);
    std::vector<Json> docs;
    for (int i = 0, n = 2 + int(rng_() % 3); i < n; ++i)
      docs.push_back({{"question", words(4) + "?"},
                      {"subject", name.substr(5)},
                      {"choices", {words(1), words(2), words(1), words(1)}},
                      {"answer", int(rng_() % 4)}});
    write_split(name, "test", docs);
    subjects.push_back({e.path().string(), random_});
  }
  ASSERT_EQ(subjects.size(), 57u);
  const std::string mout = d_ / "mmlu.json";
  r = run_nekton("eval tasks eval.model=" + random_ + " eval.tasks=mmlu eval.data=" + data_ +
                 " eval.write_out=100 eval.output=" + mout);
  ASSERT_EQ(r.code, 0) << r.out;
  const Json mres = Json::parse(test::read_file(mout));
  EXPECT_EQ(mres["groups"].size(), 5u);
  EXPECT_EQ(mres["results"]["mmlu_stem"]["alias"], " - stem");
  EXPECT_EQ(mres["results"]["mmlu_anatomy"]["alias"], "  - anatomy");
  EXPECT_EQ(mres["group_subtasks"]["mmlu"].size(), 4u);
  EXPECT_EQ(mres["group_subtasks"]["mmlu_stem"].size(), 19u);
  Json plan = {
      {"task_dir", kTasks},
      {"groups", {"mmlu", "mmlu_stem", "mmlu_other", "mmlu_social_sciences", "mmlu_humanities"}}};
  expect_reference(subjects, mout, plan);

  // Errors name the group file and key.
  auto bad = [&](const std::string& file, const std::string& text) {
    test::write_file(dir + "/" + file + ".yaml", text);
    return run_nekton("eval tasks eval.model=" + random_ + " eval.task_dir=" + dir +
                      " eval.tasks=" + file + " eval.data=" + data_);
  };
  r = bad("g_unknown", "group: g_unknown\ntask: [t_a, no_such]\n");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "g_unknown.yaml: task: 'no_such': no task, group or tag 'no_such'"))
      << r.out;
  r = bad("g_metric", "group: g_metric\ntask: [t_a]\naggregate_metric_list:\n  - metric: f1\n");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out,
                       "g_metric.yaml: aggregate_metric_list[0]: none of the group's "
                       "tasks reports 'f1,none'"))
      << r.out;
  const std::pair<std::string, std::string> cases[] = {
      // An inline task missing keys, or without a name; a group key beside a
      // task name; a bad key of a group defined in place.
      {"group: g_bad_inline\ntask:\n  - task: x\n    doc_to_text: y\n",
       "g_bad_inline.yaml: task[0]: test_split: missing"},
      {"group: g_nameless\ntask:\n  - num_fewshot: 2\n", "g_nameless.yaml: task[0].task: missing"},
      {"group: g_subgroup\ntask:\n  - group: s\n    task: t_a\n",
       "g_subgroup.yaml: task[0]: 'group' beside a task name"},
      {"group: g_inner_bad\ntask:\n  - group: s\n    task: [t_a]\n    aggregate_metric_list: 3\n",
       "g_inner_bad.yaml: task[0]: aggregate_metric_list: must be a list"},
      // t_a as it is and with the keys a tag's override puts over it.
      {"group: g_twice\ntask:\n  - t_a\n  - task: other_tag\n    num_fewshot: 1\n"
       "  - task: pair_tasks\n    num_fewshot: 2\n",
       "task 't_a' is defined twice in this evaluation"},
      {"group: g_self\ntask: [t_a, g_self]\n", "g_self.yaml: task: group 'g_self' holds itself"},
  };
  for (const auto& [text, message] : cases) {
    const std::string name = text.substr(7, text.find('\n') - 7);
    r = bad(name, text);
    EXPECT_EQ(r.code, 1) << name;
    EXPECT_TRUE(contains(r.out, message)) << name << "\n" << r.out;
  }
  r = bad("g_agg",
          "group: g_agg\ntask: [t_a]\naggregate_metric_list:\n  - metric: acc\n"
          "    aggregation: median\n");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "g_agg.yaml: aggregate_metric_list[0].aggregation: 'median'"))
      << r.out;
}

}  // namespace
}  // namespace nk
