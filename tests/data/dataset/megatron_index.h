// Runs the independent reader/writer of Megatron indexed datasets
// (tests/data/dataset/megatron_index.py, numpy only) that checks our files both ways.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_paths.h"
#include "test_util.h"

namespace nk::test {

// The command line of megatron_index.py; append "read PREFIX" or
// "write PREFIX SPEC.json".
inline std::string megatron_index_py() {
  return std::string("/usr/bin/python3 ") + NK_SOURCE_DIR + "/tests/data/dataset/megatron_index.py";
}

struct NumpyDataset {
  std::vector<std::vector<int32_t>> sequences;
  std::vector<int64_t> doc_idx;
  std::string dtype;
};

// The dataset at `prefix` as megatron_index.py reads it.
inline NumpyDataset read_with_numpy(const std::string& prefix) {
  auto r = run_command(megatron_index_py() + " read " + prefix, false);
  EXPECT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  return {j["sequences"].get<std::vector<std::vector<int32_t>>>(),
          j["doc_idx"].get<std::vector<int64_t>>(), j["dtype"].get<std::string>()};
}

}  // namespace nk::test
