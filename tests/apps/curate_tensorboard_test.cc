// `nekton curate`'s TensorBoard event file (issue 42, item 2: curate's
// counters): read back by the independent reader (tests/train/tfevents_check.py
// --curate: the TFRecord framing and CRC-32C from the specification, the Event
// protobuf through Python's protobuf and protoc), its scalars equal the
// run's own report.json, step 0 the totals and step s stage s; with
// `tensorboard: false` there is none.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "test_paths.h"
#include "test_util.h"

namespace nk {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::contains;
using test::TempDir;

std::vector<std::string> curate_event_files(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      out.push_back(e.path().string());
  return out;
}

TEST(CurateTensorBoard, CountersEqualReportJson) {
  TempDir dir("nk_curate_tb");
  // Kept, short (word_count), duplicate (exact_dedup), malformed and empty
  // records, so every stage and total is a different number.
  std::string jl;
  for (int i = 0; i < 12; ++i) {
    std::string text = fmt::format(
        "Record {} of the mill by the river, where the wheel turns and the water runs under "
        "the old stone bridge all year.",
        i % 9);
    if (i % 5 == 4) text = "Too short.";
    jl += json({{"id", fmt::format("r{}", i)}, {"text", text}}).dump() + "\n";
  }
  jl += "{\"id\": \"bad\", \"text\": \"broken\"\n";
  jl += json({{"id", "empty"}, {"text", "  \n "}}).dump() + "\n";
  test::write_file(dir / "in.jsonl", jl);
  auto pipeline = [&](const std::string& in, const std::string& out) {
    return fmt::format(R"(input:
  paths: [{0}/{1}]
output:
  dir: {0}/{2}
stages:
  - type: clean
  - {{type: word_count, min_words: 5}}
  - type: exact_dedup
)",
                       dir.path().string(), in, out);
  };
  test::write_file(dir / "p.yaml", pipeline("in.jsonl", "out"));
  auto r = test::run_nekton("curate --config " + dir / "p.yaml");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<std::string> files = curate_event_files(dir / "out");
  ASSERT_EQ(files.size(), 1u) << r.out;
  EXPECT_TRUE(contains(r.out, "TensorBoard events in " + files[0])) << r.out;
  // The report has a total of each kind and three stages that removed some.
  const json report = json::parse(test::read_file(dir / "out/report.json"));
  ASSERT_EQ(report["stages"].size(), 3u);
  EXPECT_GT(report["removed_docs"].get<int64_t>(), 0);
  EXPECT_GT(report["bad_records"].get<int64_t>(), 0);

  NK_REQUIRE_ASSET(test::run_command("protoc --version && /usr/bin/python3 -c 'import "
                                     "google.protobuf'")
                           .code == 0,
                   "protoc or Python's protobuf (protobuf-compiler, python3-protobuf)");
  const std::string check =
      "/usr/bin/python3 " + std::string(NK_SOURCE_DIR) + "/tests/train/tfevents_check.py --curate ";
  auto ok = test::run_command(check + files[0] + " " + (dir / "out/report.json"));
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_TRUE(contains(ok.out, "ok: 5 events, steps [0, 1, 2, 3]")) << ok.out;

  // The reader is not fooled: another run's report (other counts) fails.
  test::write_file(dir / "in2.jsonl", jl + jl);
  test::write_file(dir / "p2.yaml", pipeline("in2.jsonl", "out2"));
  ASSERT_EQ(test::run_nekton("curate --config " + dir / "p2.yaml").code, 0);
  auto other = test::run_command(check + files[0] + " " + (dir / "out2/report.json"));
  EXPECT_NE(other.code, 0) << other.out;
  EXPECT_TRUE(contains(other.out, "but report.json has")) << other.out;

  // Off: no event file.
  auto off = test::run_nekton("curate --config " + dir / "p.yaml" + " tensorboard=false " +
                              "output.dir=" + (dir / "out3"));
  ASSERT_EQ(off.code, 0) << off.out;
  EXPECT_TRUE(curate_event_files(dir / "out3").empty());
  EXPECT_FALSE(contains(off.out, "TensorBoard events")) << off.out;
}

}  // namespace
}  // namespace nk
