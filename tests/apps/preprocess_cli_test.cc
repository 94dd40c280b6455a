// `nekton preprocess` end to end: keys in --help, plain + zstd inputs given as a
// repeated key or a YAML config, output checked with the independent numpy
// reader, a summary on stdout, and each user error a clear message, exit 1 and
// no output files.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

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

// kill -9 at random moments, then a rerun: the same PREFIX.bin/.idx as an
// uninterrupted run, and nothing the killed runs left (PREFIX.bin.tmp.PID...).
TEST(PreprocessCli, KillNineThenRerunLeavesNoTemporaries) {
  TempDir dir("nk_pkill");
  std::vector<std::string> docs;
  for (int i = 0; i < 60000; ++i)
    docs.push_back("Document " + std::to_string(i) + " " +
                   std::string(200 + i % 300, 'a' + i % 26));
  test::write_file(dir / "in.jsonl", jsonl(docs));
  auto args = [&](const std::string& prefix) {
    return std::vector<std::string>{"preprocess", "preprocess.input=" + (dir / "in.jsonl"),
                                    "data.prefix=" + (dir / prefix), "preprocess.progress=none",
                                    "preprocess.workers=2"};
  };
  auto t0 = std::chrono::steady_clock::now();
  auto r = nekton("preprocess.input=" + (dir / "in.jsonl") + " data.prefix=" + (dir / "ref") +
                  " preprocess.progress=none preprocess.workers=2");
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string want_bin = test::read_file(dir / "ref.bin"),
                    want_idx = test::read_file(dir / "ref.idx");
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> when(0.1 * secs, 0.9 * secs);
  int left = 0;  // kills that left a temporary behind
  for (int trial = 0; trial < 3; ++trial) {
    const std::string prefix = "t" + std::to_string(trial);
    SCOPED_TRACE(prefix);
    for (int kill = 0; kill < 2; ++kill) {
      pid_t pid = test::spawn_nekton(args(prefix), dir / (prefix + ".log"));
      ASSERT_GT(pid, 0);
      const fs::path tmp = dir / (prefix + ".bin.tmp." + std::to_string(pid));
      bool reaped = false;  // the run ended before the kill (its pid may be reused)
      if (kill == 0) {      // at a random moment of the run
        std::this_thread::sleep_for(std::chrono::duration<double>(when(rng)));
      } else {  // once it writes its output (a loaded machine may start it late)
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (!fs::exists(tmp) && std::chrono::steady_clock::now() < give_up &&
               !(reaped = ::waitpid(pid, nullptr, WNOHANG) == pid))
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (!reaped) std::this_thread::sleep_for(std::chrono::duration<double>(when(rng) / 8));
      }
      if (!reaped) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
      left += fs::exists(tmp);
    }
    std::vector<std::string> a = args(prefix);
    auto rerun = nekton(a[1] + " " + a[2] + " " + a[3]);
    ASSERT_EQ(rerun.code, 0) << rerun.out;
    EXPECT_TRUE(test::read_file(dir / (prefix + ".bin")) == want_bin);
    EXPECT_TRUE(test::read_file(dir / (prefix + ".idx")) == want_idx);
    fs::remove(dir / (prefix + ".log"));
  }
  EXPECT_EQ(test::leftover_files(dir.path().string()), std::vector<std::string>{});
  EXPECT_GT(left, 0) << "no kill landed while the output was being written";
  std::printf("kills that left temporaries: %d of 6\n", left);
}

// A second run on a prefix that a live run is writing fails at once, naming
// that run's pid; once it is gone (kill -9 included) the prefix is free.
TEST(PreprocessCli, BusyPrefixFailsAtOnceNamingThePid) {
  TempDir dir("nk_pbusy");
  // The first run holds PREFIX.lock while it waits for its input to open.
  ASSERT_EQ(::mkfifo((dir / "fifo.jsonl").c_str(), 0644), 0);
  test::write_file(dir / "in.jsonl", jsonl({"one", "two"}));
  pid_t first = test::spawn_nekton({"preprocess", "preprocess.input=" + (dir / "fifo.jsonl"),
                                    "data.prefix=" + (dir / "out"), "preprocess.progress=none"},
                                   dir / "first.log");
  ASSERT_GT(first, 0);
  std::string holder = test::wait_for_file(dir / "out.lock");
  EXPECT_EQ(holder, std::to_string(first) + "\n") << test::read_file(dir / "first.log");
  auto r = nekton("preprocess.input=" + (dir / "in.jsonl") + " data.prefix=" + (dir / "out"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "error: '" + (dir / "out") + "' is in use by nekton pid " +
                                  std::to_string(first) + " (lock file '" + (dir / "out.lock") +
                                  "')"))
      << r.out;
  EXPECT_FALSE(fs::exists(dir / "out.bin"));
  ::kill(first, SIGKILL);
  int st = 0;
  ::waitpid(first, &st, 0);
  r = nekton("preprocess.input=" + (dir / "in.jsonl") + " data.prefix=" + (dir / "out"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(test::read_with_numpy(dir / "out").sequences, bytes_with_eod({"one", "two"}));
  EXPECT_EQ(test::leftover_files(dir.path().string()), std::vector<std::string>{});
}

}  // namespace
}  // namespace nk
