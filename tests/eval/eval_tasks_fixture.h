// The fixtures of the `nekton eval tasks` tests (eval_tasks_cli_test.cc,
// eval_groups_cli_test.cc, eval_server_test.cc): a tiny random Llama over bytes and the counting
// model saved with the bytes tokenizer, synthetic documents in a task data
// folder, and the run of harness_reference.py over nekton's outputs.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/model_io.h"
#include "data/tokenizer/tokenizer.h"
#include "infer/counting_model.h"
#include "model/tiny_config.h"
#include "test_paths.h"
#include "test_util.h"

namespace nk {

inline const std::string kTasks = std::string(NK_SOURCE_DIR) + "/configs/eval_tasks/";

// A task data folder and two models in a temporary folder NAME: a random
// Llama of CONTEXT positions and the counting model; words drawn from SEED.
class EvalTaskFolders : public ::testing::Test {
 protected:
  using Json = nlohmann::ordered_json;

  EvalTaskFolders(const std::string& name, int64_t context, unsigned seed)
      : d_(name), context_(context), rng_(seed) {}

  void SetUp() override {
    data_ = d_.fresh("data").string();
    random_ = d_ / "random";
    auto m = std::make_unique<Transformer>(test::tiny_config(true, 257, context_), DType::F32, 11);
    save_model(random_, *m);
    store_tokenizer("bytes", random_);
    counting_ = d_ / "counting";
    auto c = test::counting_model();
    save_model(counting_, *c);
    store_tokenizer("bytes", counting_);
  }
  std::string word() {
    static const char* kWords[] = {"the",  "cat",  "sat", "on",   "a",    "mat",  "dog",  "ran",
                                   "fast", "into", "red", "barn", "café", "with", "blue", "hat"};
    return kWords[rng_() % 16];
  }
  std::string words(int n) {
    std::string s;
    for (int i = 0; i < n; ++i) {
      if (i) s += ' ';
      s += word();
    }
    return s;
  }
  void write_split(const std::string& task, const std::string& split,
                   const std::vector<Json>& docs) {
    std::filesystem::create_directories(data_ + "/" + task);
    std::string s;
    for (const Json& d : docs) s += d.dump() + "\n";
    test::write_file(data_ + "/" + task + "/" + split + ".jsonl", s);
  }
  std::string yaml(const std::string& name, const std::string& text) {
    const std::string p = d_ / (name + ".yaml");
    test::write_file(p, text);
    return p;
  }

  test::TempDir d_;
  std::string data_, random_, counting_;
  int64_t context_;
  std::mt19937 rng_;
};

class EvalTasksCli : public EvalTaskFolders {
 protected:
  EvalTasksCli() : EvalTaskFolders("nk_evaltasks", 48, 7) {}

  // Runs the reference over the tasks (yaml, model) with nekton's outputs.
  void expect_reference(const std::vector<std::pair<std::string, std::string>>& tasks,
                        const std::string& out, const Json& style = Json::object()) {
    Json plan = {{"data", data_},  {"results", out},          {"samples", out + ".samples.jsonl"},
                 {"ll_tol", 1e-5}, {"bootstrap_iters", 3000}, {"tasks", Json::array()}};
    for (const auto& [y, m] : tasks) plan["tasks"].push_back({{"yaml", y}, {"model", m}});
    for (auto it = style.begin(); it != style.end(); ++it) plan[it.key()] = it.value();
    test::write_file(d_ / "plan.json", plan.dump());
    auto r = test::run_command(std::string("/usr/bin/python3 ") + NK_SOURCE_DIR +
                               "/tests/eval/harness_reference.py " + (d_ / "plan.json"));
    EXPECT_EQ(r.code, 0) << r.out;
    std::cout << r.out;
  }
};

}  // namespace nk
