// Few-shot context construction by the harness's rule, on hand-made
// documents whose expected prompts are written out here: the description,
// text + target_delimiter + answer + fewshot_delimiter per shot (an integer
// target is its choice, a list target its first item, an empty target its
// text alone), then the document's text; first_n's shots in pool order with
// the scored document left out when the pool is the scored split.
#include "eval/task_prompt.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace nk {
namespace {

using Json = nlohmann::ordered_json;

// Read from YAML as a user writes it (which checks the loader too).
TaskConfig config() {
  static test::TempDir d("nk_taskprompt");
  test::write_file(d / "t.yaml", R"(task: t
test_split: test
fewshot_split: test
doc_to_text: "Q: {{q}}"
doc_to_target: "{{a}}"
doc_to_choice: "{{opts}}"
description: "About {{topic}}.\n"
target_delimiter: " -> "
fewshot_delimiter: "\n##\n"
fewshot_config:
  sampler: first_n
)");
  return load_task_config(d / "t.yaml");
}

TEST(TaskPrompt, FewshotContextByTheHarnessRule) {
  const TaskConfig c = config();
  const TaskPrompter pr(c);
  const std::vector<Json> pool = {
      {{"q", "one"}, {"a", "1"}, {"opts", {"x", "y"}}, {"topic", "z"}},
      {{"q", "two"}, {"a", "[\"first\", \"second\"]"}, {"opts", {"x"}}, {"topic", "z"}},
      {{"q", "three"}, {"a", ""}, {"opts", {"x"}}, {"topic", "z"}},
      {{"q", "four"}, {"a", "0"}, {"opts", {"w"}}, {"topic", "maths"}},
  };
  const std::string file = "pool.jsonl";
  FewshotSampler s(c, &pool);
  // Scoring pool[3]: first_n draws 3 + 1 and leaves pool[3] out.
  const std::vector<int64_t> idx = s.draw(pool[3], 3);
  EXPECT_EQ(idx, (std::vector<int64_t>{0, 1, 2}));
  std::vector<std::pair<const Json*, DocRef>> shots;
  for (int64_t i : idx) shots.push_back({&pool[size_t(i)], DocRef{&c, &file, i}});
  EXPECT_EQ(pr.context(pool[3], DocRef{&c, &file, 3}, shots),
            "About maths.\nQ: one -> y\n##\nQ: two -> first\n##\nQ: threeQ: four");
  // Scoring pool[1]: it is skipped, the next one taken.
  EXPECT_EQ(s.draw(pool[1], 2), (std::vector<int64_t>{0, 2}));
  // Too few documents: named.
  const std::string e = test::error_of([&] { s.draw(pool[0], 4); });
  EXPECT_TRUE(test::contains(e, "t.yaml: num_fewshot 4 needs 5 documents in split 'test'")) << e;
}

TEST(TaskPrompt, BadDocumentsNameFileDocumentAndField) {
  const TaskConfig c = config();
  const TaskPrompter pr(c);
  const std::string file = "data/test.jsonl";
  const Json doc = {{"q", "x"}, {"a", "5"}, {"opts", {"p", "q"}}};
  std::string e = test::error_of([&] {
    pr.answer(doc, pr.target(doc, {&c, &file, 7}), {&c, &file, 7});
  });
  EXPECT_TRUE(test::contains(e,
                             "t.yaml: data/test.jsonl document 7: doc_to_target: choice index 5 "
                             "is out of range"))
      << e;
  e = test::error_of([&] { pr.text(Json{{"a", "1"}}, {&c, &file, 2}); });
  EXPECT_TRUE(test::contains(e, "document 2: doc_to_text") && test::contains(e, "'q' is undefined"))
      << e;
  e = test::error_of([&] { pr.choices(Json{{"q", "x"}, {"opts", "not a list"}}, {&c, &file, 3}); });
  EXPECT_TRUE(test::contains(e, "document 3: doc_to_choice")) << e;
}

}  // namespace
}  // namespace nk
