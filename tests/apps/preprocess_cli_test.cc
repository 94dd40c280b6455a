// `nekton preprocess` end to end: keys in --help, plain + zstd inputs given as a
// repeated key or a YAML config, output checked with the independent numpy
// reader, a summary on stdout, and each user error a clear message, exit 1 and
// no output files.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/dataset/megatron_index.h"
#include "data/tokenizer/tokenizer.h"
#include "test_util.h"

namespace nk {
namespace {

using test::contains;
using test::TempDir;
namespace fs = std::filesystem;

test::RunResult nekton(const std::string& args) {
  return test::run_nekton("preprocess " + args);
}

std::string jsonl(const std::vector<std::string>& docs) {
  std::string s;
  for (auto& d : docs) s += nlohmann::json({{"text", d}}).dump() + "\n";
  return s;
}

std::vector<std::vector<int32_t>> bytes_with_eod(const std::vector<std::string>& docs) {
  auto tok = load_tokenizer("bytes");
  std::vector<std::vector<int32_t>> out;
  for (auto& d : docs) {
    out.push_back(tok->encode(d));
    out.back().push_back(tok->eod_id());
  }
  return out;
}

TEST(PreprocessCli, HelpListsEveryKey) {
  auto r = nekton("--help");
  EXPECT_EQ(r.code, 0) << r.out;
  for (auto key : {"preprocess.input", "preprocess.json_key", "preprocess.tokenizer",
                   "preprocess.output_prefix", "preprocess.append_eod", "preprocess.workers",
                   "preprocess.skip_bad", "preprocess.invalid_utf8", "preprocess.progress"})
    EXPECT_TRUE(contains(r.out, key)) << key;
  EXPECT_TRUE(contains(test::run_command(test::nekton_bin() + " --help").out, "preprocess"));
}

// The output prefix, the tokenizer and invalid_utf8 are the data.* keys that
// `nekton train` reads the dataset with; their preprocess.* names still work.
TEST(PreprocessCli, SharesTheDataKeysWithTraining) {
  auto r = nekton("--help");
  for (auto key : {"data.prefix", "data.tokenizer", "data.invalid_utf8",
                   "older name of data.prefix", "older name of data.tokenizer"})
    EXPECT_TRUE(contains(r.out, key)) << key << "\n" << r.out;
  EXPECT_FALSE(contains(r.out, "data.blend")) << r.out;  // only the keys preprocess uses
  TempDir dir("nk_pcli");
  test::write_file(dir / "a.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"bad \xff\"}\n");
  test::write_file(dir / "r.yaml", "data:\n  prefix: " + (dir / "out") +
                                       "\n  tokenizer: bytes\n  invalid_utf8: replace\n"
                                       "preprocess:\n  input: " +
                                       (dir / "a.jsonl") + "\n  progress: none\n");
  auto run = test::run_command(test::nekton_bin() + " preprocess --config " + (dir / "r.yaml"));
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_EQ(test::read_with_numpy(dir / "out").sequences.size(), 2u);  // the bad one repaired
  r = nekton("preprocess.input=" + (dir / "a.jsonl") + " data.prefix=" + (dir / "x") +
             " data.invalid_utf8=bogus");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "data.invalid_utf8: expected error or replace, got 'bogus'"))
      << r.out;
  r = nekton("preprocess.input=" + (dir / "a.jsonl"));
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "data.prefix: no output given")) << r.out;
}

TEST(PreprocessCli, PlainAndZstdInputsRepeatedKey) {
  TempDir dir("nk_pcli");
  std::vector<std::string> a = {"first doc", "caf\xC3\xA9", "third"}, b = {"zstd one", "zstd two"};
  test::write_file(dir / "a.jsonl", jsonl(a));
  test::write_file(dir / "b.jsonl", jsonl(b));
  ASSERT_EQ(test::run_command("zstd -q --rm " + (dir / "b.jsonl")).code, 0);
  auto r = nekton("preprocess.input=" + (dir / "a.jsonl") + " preprocess.input=" +
                  (dir / "b.jsonl.zst") + " preprocess.output_prefix=" + (dir / "out") +
                  " preprocess.workers=2 preprocess.progress=bar");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "5 documents")) << r.out;
  EXPECT_TRUE(contains(r.out, "MB/s")) << r.out;
  EXPECT_TRUE(contains(r.out, "100.0%")) << r.out;  // the bar's last state
  std::vector<std::string> all = a;
  all.insert(all.end(), b.begin(), b.end());
  EXPECT_EQ(test::read_with_numpy(dir / "out").sequences, bytes_with_eod(all));
}

TEST(PreprocessCli, YamlConfigWithCommaList) {
  TempDir dir("nk_pcli");
  test::write_file(dir / "a.jsonl", "{\"body\": \"one\"}\n");
  test::write_file(dir / "b.jsonl", "{\"body\": \"two\"}\n{\"body\": 3}\n");
  test::write_file(dir / "p.yaml", "preprocess:\n  input: " + (dir / "a.jsonl") + ", " +
                                       (dir / "b.jsonl") + "\n  json_key: body\n  output_prefix: " +
                                       (dir / "out") + "\n  skip_bad: true\n  progress: none\n");
  auto r = test::run_command(test::nekton_bin() + " preprocess --config " + (dir / "p.yaml"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "1 not a string")) << r.out;
  EXPECT_TRUE(contains(r.out, "b.jsonl:2: not a string")) << r.out;
  EXPECT_EQ(test::read_with_numpy(dir / "out").sequences, bytes_with_eod({"one", "two"}));
}

TEST(PreprocessCli, ErrorsAreClearAndLeaveNoOutput) {
  TempDir dir("nk_pcli");
  test::write_file(dir / "bad.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\"\n");
  std::string out = " preprocess.output_prefix=" + (dir / "out") + " preprocess.progress=log";

  auto r = nekton("preprocess.input=" + (dir / "bad.jsonl") + out);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "error: " + (dir / "bad.jsonl") + ":2: invalid JSON")) << r.out;

  r = nekton("preprocess.input=" + (dir / "missing.jsonl") + out);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, (dir / "missing.jsonl") + ": cannot open")) << r.out;

  r = nekton("preprocess.input=" + (dir / "bad.jsonl") + out + " preprocess.tokenizer=nope");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "tokenizer 'nope'")) << r.out;

  r = nekton("preprocess.inputs=x" + out);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "preprocess.input")) << r.out;

  r = nekton(out);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "no input files")) << r.out;

  EXPECT_EQ(dir.files(), std::vector<std::string>{"bad.jsonl"});
}

}  // namespace
}  // namespace nk
