// The reference the Jinja and chat template tests compare with: Hugging
// Face's own Jinja (@huggingface/jinja, npm assets), run by
// tests/data/chat/render.js over a batch of cases.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "data/tokenizer/tokenizer.h"
#include "test_paths.h"
#include "test_util.h"

namespace nk::test {

inline bool have_jinja_reference() {
  return std::system("node --version > /dev/null 2>&1") == 0 &&
         std::filesystem::exists(std::filesystem::path(assets_dir()) /
                                 "npm/node_modules/@huggingface/jinja/package.json");
}
#define REQUIRE_JINJA_REFERENCE() \
  NK_REQUIRE_ASSET(::nk::test::have_jinja_reference(), "node or @huggingface/jinja")

// Renders every case (see render.js for their forms) with the reference:
// {"text"} or {"error"} each, in order.
inline nlohmann::json jinja_reference(const nlohmann::ordered_json& cases) {
  TempDir d("nk_jinja_ref");
  const std::string in = (d.path() / "cases.json").string(), out = (d.path() / "out.json").string();
  std::ofstream(in) << cases.dump();
  const std::string cmd = "NEKTON_ASSETS='" + assets_dir() + "' node '" +
                          std::string(NK_SOURCE_DIR) + "/tests/data/chat/render.js' '" + in +
                          "' '" + out + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(out);
  return nlohmann::json::parse(f);
}

}  // namespace nk::test
