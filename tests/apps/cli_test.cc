// End-to-end tests of the `nekton` binary: help, a tiny train + generate, and
// every bad input a user can give gets a clear error, a non-zero exit and no
// output left behind.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <thread>
#include <vector>

#include "apps/mpirun_launch.h"
#include "data/dataset/indexed_dataset.h"
#include "data/tokenizer/tokenizer.h"
#include "test_paths.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;

namespace test = nk::test;
using test::run_nekton;
using test::RunResult;
using test::write_file;

// A fresh folder `name` under one folder per process (ctest runs these tests in
// parallel processes), removed at exit.
fs::path tmp(const std::string& name) {
  static const test::TempDir root("nk_cli");
  return root.fresh(name);
}

std::string corpus(const fs::path& dir) {
  std::string text;
  for (int i = 0; i < 300; ++i) text += "All work and no play makes a dull model. ";
  write_file(dir / "c.txt", text);
  return (dir / "c.txt").string();
}

const char* kTiny =
    "model.preset=gpt-tiny model.n_layer=1 model.d_model=32 model.n_head=2 model.d_ff=64 "
    "train.micro_batch=2 train.seq_len=16 train.global_batch=2 train.steps=3 "
    "train.val_every=0 train.peak_tflops=1 ";

TEST(Cli, HelpListsCommandsAndKeys) {
  RunResult r = run_nekton("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("quickstart"), std::string::npos);
  EXPECT_NE(r.out.find("generate"), std::string::npos);
  r = run_nekton("train --help");
  EXPECT_EQ(r.code, 0);
  for (const char* key : {"train.lr", "train.micro_batch", "model.preset", "data.path"})
    EXPECT_NE(r.out.find(key), std::string::npos) << key;
  EXPECT_NE(r.out.find("0.0006"), std::string::npos) << "default of train.lr shown";
}

// --print-config prints the settings and the model they build, each derived
// size with its rule, and trains nothing.
TEST(Cli, PrintConfigShowsTheDerivedSizes) {
  fs::path d = tmp("print");
  const std::string out = (d / "out").string();
  RunResult r = run_nekton(
      "train --print-config model.preset=gpt2-124m model.d_model=512 "
      "data.path=" +
      corpus(d) + " train.out_dir=" + out);
  EXPECT_EQ(r.code, 0) << r.out;
  for (const char* want : {"lr: 0.0006", "model_built:", "  d_model: 512\n",
                           "  n_head: 8  # derived: d_model / 64, the preset's head size",
                           "  d_ff: 2048  # derived: 4 d_model (GPT-2's n_inner)",
                           "  head_dim: 64\n", "  n_layer: 12\n"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  EXPECT_FALSE(fs::exists(out));
  r = run_nekton("finetune --print-config model.preset=llama-1b model.n_head=16 data.sft_path=x");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("  n_kv_head: 4  # derived: n_head / 4"), std::string::npos) << r.out;
  r = run_nekton("generate --print-config");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--print-config is an option of nekton train, finetune and align only"),
            std::string::npos)
      << r.out;
}

// --nproc's placement: unbound up to one rank a core; past that round robin
// over the cores, each rank bound to its own, and mpirun (this host's
// OpenMPI) takes the flags.
TEST(Cli, NprocPlacesRanksRoundRobinOverSharedCores) {
  const int cores = int(std::thread::hardware_concurrency());
  using Args = std::vector<std::string>;
  EXPECT_EQ(nk::mpirun_placement(1), (Args{"--oversubscribe", "--bind-to", "none"}));
  EXPECT_EQ(nk::mpirun_placement(cores), (Args{"--oversubscribe", "--bind-to", "none"}));
  const Args shared = {"--oversubscribe", "--map-by", "core", "--bind-to", "core:overload-allowed"};
  EXPECT_EQ(nk::mpirun_placement(cores + 1), shared);
  const Args cmd = nk::mpirun_command(cores + 1, "true", {"a", "b"});
  Args want = {"mpirun", "-np", std::to_string(cores + 1)};
  want.insert(want.end(), shared.begin(), shared.end());
  want.insert(want.end(), {"true", "a", "b"});
  EXPECT_EQ(cmd, want);
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  std::string line;
  for (const std::string& a : cmd) line += a + " ";
  EXPECT_EQ(std::system((line + ">/dev/null 2>&1").c_str()), 0) << line;
}

TEST(Cli, TrainThenGenerate) {
  fs::path d = tmp("ok");
  RunResult r = run_nekton(std::string("train ") + kTiny + "data.path=" + corpus(d) +
                           " train.out_dir=" + (d / "run").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step     3/3"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(d / "run" / "model" / "config.json"));
  r = run_nekton("generate generate.model=" + (d / "run" / "model").string() +
                 " generate.prompt=All generate.max_tokens=20 generate.temperature=0");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.rfind("All", 0), 0u) << r.out;
  EXPECT_GE(r.out.size(), 20u);
}

// Each case: exit code 1, the message names what is wrong, no output folder.
void expect_clean_failure(const std::string& args, const fs::path& out,
                          const std::vector<std::string>& needles) {
  RunResult r = run_nekton(args);
  EXPECT_EQ(r.code, 1) << r.out;
  for (auto& n : needles)
    EXPECT_NE(r.out.find(n), std::string::npos) << "'" << n << "' in: " << r.out;
  EXPECT_FALSE(fs::exists(out)) << "partial output left at " << out;
}

TEST(Cli, BadInputsFailCleanly) {
  fs::path d = tmp("bad");
  std::string data = corpus(d), out = (d / "out").string();
  std::string base = std::string("train ") + kTiny + "train.out_dir=" + out + " ";

  expect_clean_failure(base + "--config " + (d / "missing.yaml").string() + " data.path=" + data,
                       out, {"missing.yaml", "not found"});
  write_file(d / "bad.yaml", "train:\n  lr: [1, 2\n");
  expect_clean_failure(base + "--config " + (d / "bad.yaml").string() + " data.path=" + data, out,
                       {"bad.yaml"});
  write_file(d / "typo.yaml", "train:\n  lr: 0.001\n  micro_bach: 4\n");
  expect_clean_failure(base + "--config " + (d / "typo.yaml").string() + " data.path=" + data, out,
                       {"typo.yaml:3", "train.micro_bach", "train.micro_batch"});
  expect_clean_failure(base + "data.path=" + data + " train.lr=fast", out, {"train.lr", "fast"});
  expect_clean_failure(base + "data.path=" + data + " model.n_head=3", out,
                       {"model.n_head", "d_model"});
  expect_clean_failure(base + "data.path=" + (d / "nope.txt").string(), out, {"nope.txt"});
  write_file(d / "empty.txt", "");
  expect_clean_failure(base + "data.path=" + (d / "empty.txt").string(), out,
                       {"empty.txt", "empty"});
  write_file(d / "latin1.txt", std::string("caf\xe9 au lait, ") + std::string(200, 'x'));
  expect_clean_failure(base + "data.path=" + (d / "latin1.txt").string(), out,
                       {"latin1.txt", "UTF-8", "3"});
  expect_clean_failure(base + "data.path=" + data + " --frobnicate", out, {"--frobnicate"});
  expect_clean_failure("frobnicate", out, {"unknown command"});
}

// Random ids below `vocab` in 100 documents, as Megatron's preprocessing writes them.
std::string indexed(const fs::path& prefix, int32_t vocab, uint32_t seed) {
  nk::IndexedDatasetWriter w(prefix.string(), nk::token_dtype_for_vocab(vocab));
  for (int d = 0; d < 100; ++d) {
    std::vector<int32_t> doc(size_t(5 + (seed * 7 + uint32_t(d) * 13) % 40));
    for (auto& t : doc) t = int32_t((seed += 2654435761u) >> 8) % vocab;
    w.add_document(doc);
  }
  w.finish();
  return prefix.string();
}

TEST(Cli, TrainOnABlendFromYamlStopAndResume) {
  fs::path d = tmp("indexed");
  std::string a = indexed(d / "a", 250, 1), b = indexed(d / "b", 250, 2);
  write_file(d / "blend.yaml",
             "data:\n  blend: [0.4, " + a + ", 0.6, " + b + "]\n  split: 90,10,0\n");
  std::string args = std::string("train --config ") + (d / "blend.yaml").string() + " " + kTiny +
                     "model.vocab_size=256 train.steps=4 train.out_dir=" + (d / "run").string();
  RunResult r = run_nekton(args + " train.exit_at_step=2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("2 datasets"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(d / "run" / "model" / "trainer_state.json"));
  EXPECT_TRUE(fs::exists(d / "cache"));  // indices cached beside the data
  r = run_nekton(args + " train.resume_from=" + (d / "run").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("at step 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step     4/4"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step     1/4"), std::string::npos) << r.out;

  // Data made for a larger vocabulary: named, and nothing written.
  std::string big = indexed(d / "big", 5000, 3);
  expect_clean_failure(std::string("train ") + kTiny + "data.prefix=" + big +
                           " train.out_dir=" + (d / "out").string(),
                       d / "out", {big, "model.vocab_size"});
}

TEST(Cli, CorruptModelFailsCleanly) {
  fs::path d = tmp("corrupt");
  RunResult r = run_nekton(std::string("train ") + kTiny + "data.path=" + corpus(d) +
                           " train.out_dir=" + (d / "run").string());
  ASSERT_EQ(r.code, 0) << r.out;
  fs::path st = d / "run" / "model" / "model.safetensors";
  // Truncate the weights: loading must fail naming the file.
  fs::resize_file(st, fs::file_size(st) / 2);
  r = run_nekton("generate generate.model=" + (d / "run" / "model").string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("model.safetensors"), std::string::npos) << r.out;
  // Garbage header.
  write_file(st, std::string("\x10\0\0\0\0\0\0\0{not json at all", 24));
  r = run_nekton("generate generate.model=" + (d / "run" / "model").string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("model.safetensors"), std::string::npos) << r.out;
  // config.json missing a field.
  write_file(d / "run" / "model" / "config.json", R"({"arch": "gpt2"})");
  r = run_nekton("generate generate.model=" + (d / "run" / "model").string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("config.json"), std::string::npos) << r.out;
}

}  // namespace

namespace nk {
namespace {

// The whole quickstart pipeline at 3 steps: BPE training, preprocess into an
// indexed dataset, training on it, a sample; generation then decodes with the
// tokenizer kept beside the model; a second run reuses the prepared data.
TEST(Cli, QuickstartPipelineThenGenerate) {
  test::TempDir d("nk_quickstart");
  std::string out = d / "qs";
  auto r = test::run_nekton("quickstart train.steps=3 train.val_every=3 train.out_dir=" + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("trained a 4096-token BPE vocabulary"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step     3/3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sample:\nWater"), std::string::npos) << r.out;
  // The loss curves as a PNG (nekton plot's chart).
  EXPECT_NE(r.out.find("loss curves: " + out + "/loss.png"), std::string::npos) << r.out;
  EXPECT_EQ(test::read_file(out + "/loss.png").substr(0, 8), "\x89PNG\r\n\x1a\n");
  auto ds = IndexedDataset::open(out + "/data/gcide_text_document");
  EXPECT_GT(ds->num_documents(), 100000);  // one per dictionary entry
  auto tok = load_tokenizer(stored_tokenizer(out + "/model"));
  EXPECT_EQ(tok->kind(), "bpe");
  EXPECT_EQ(tok->vocab_size(), 4096);
  // Every document ends with the tokenizer's end-of-document id.
  for (int64_t s : {int64_t(0), ds->num_sequences() - 1})
    EXPECT_EQ(ds->sequence(s).back(), tok->eod_id());

  r = test::run_nekton("generate generate.model=" + out +
                       "/model generate.prompt=Water generate.max_tokens=5 generate.temperature=0");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.rfind("Water", 0), 0u) << r.out;

  auto stamp = fs::last_write_time(out + "/tokenizer/vocab.tiktoken");
  r = test::run_nekton("quickstart train.steps=2 train.out_dir=" + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("trained a 4096-token BPE vocabulary"), std::string::npos) << r.out;
  EXPECT_EQ(fs::last_write_time(out + "/tokenizer/vocab.tiktoken"), stamp);
}

// configs/quickstart.yaml is the quickstart's training step for `nekton train`:
// it must give the very settings `nekton quickstart` trains with (the list its
// --help prints), with the data paths the quickstart writes.
TEST(Cli, QuickstartConfigFileIsTheRecipe) {
  auto help = test::run_nekton("quickstart --help");
  ASSERT_EQ(help.code, 0) << help.out;
  std::string recipe;
  const std::string intro = "trains with:\n";  // then one "  key=value" line each
  const size_t from = help.out.find(intro);
  ASSERT_NE(from, std::string::npos) << help.out;
  std::istringstream lines(help.out.substr(from + intro.size()));
  for (std::string line; std::getline(lines, line) && line.starts_with("  ");) {
    recipe += ' ';
    recipe.append(line, 2);
  }
  ASSERT_NE(recipe.find("train.steps="), std::string::npos) << help.out;
  auto from_yaml = test::run_nekton("train --print-config --config " + std::string(NK_SOURCE_DIR) +
                                    "/configs/quickstart.yaml");
  auto from_recipe = test::run_nekton("train --print-config" + recipe +
                                      " data.prefix=runs/quickstart/data/gcide_text_document"
                                      " data.tokenizer=runs/quickstart/tokenizer");
  ASSERT_EQ(from_yaml.code, 0) << from_yaml.out;
  ASSERT_EQ(from_recipe.code, 0) << from_recipe.out;
  EXPECT_EQ(from_yaml.out, from_recipe.out);
}

}  // namespace
}  // namespace nk

namespace {

// Issue 45: `nekton --help` names the guides, and each command's help opens
// with the page of docs/ for its user, a page that exists.
TEST(CliGuides, EveryCommandsHelpNamesItsGuide) {
  const RunResult top = run_nekton("--help");
  ASSERT_EQ(top.code, 0) << top.out;
  EXPECT_NE(top.out.find("docs/getting-started.md"), std::string::npos) << top.out;
  std::istringstream lines(top.out.substr(top.out.find("commands:")));
  std::string line;
  std::getline(lines, line);
  int commands = 0;
  while (std::getline(lines, line) && line.rfind("  ", 0) == 0) {
    const std::string name = line.substr(2, line.find(' ', 2) - 2);
    const RunResult r = run_nekton(name + " --help");
    ASSERT_EQ(r.out.rfind("Guide: docs/", 0), 0u) << name << ": " << r.out.substr(0, 200);
    const std::string page = r.out.substr(7, r.out.find('\n') - 7);
    EXPECT_TRUE(fs::is_regular_file(fs::path(NK_SOURCE_DIR) / page)) << name << ": " << page;
    ++commands;
  }
  EXPECT_GE(commands, 14);
}

}  // namespace
