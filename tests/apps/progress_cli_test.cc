// Long commands' progress: an updating line when stderr is a terminal (a
// pseudo-terminal here), nothing of it in a pipe (the command's summary only);
// loading a saved model, a GGUF file and a training checkpoint too.
#include <gtest/gtest.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <vector>

#include "ckpt/model_io.h"
#include "model/transformer.h"
#include "test_paths.h"
#include "test_util.h"

namespace nk {
namespace {

namespace fs = std::filesystem;
using test::contains;
using test::TempDir;

// nekton `args` with stdout and stderr on a pseudo-terminal: what it printed
// and its exit status.
test::RunResult run_in_pty(const std::vector<std::string>& args) {
  int master = -1;
  pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
  if (pid == 0) {
    std::vector<std::string> full = {test::nekton_bin()};
    full.insert(full.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : full) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(master, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, size_t(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;  // EIO: the child closed the terminal
    }
  }
  ::close(master);
  int st = 0;
  ::waitpid(pid, &st, 0);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

TEST(ProgressCli, QuantizeShowsABarOnATerminalAndNothingInAPipe) {
  TempDir dir("nk_progress");
  ModelConfig c = model_preset("llama-tiny");
  c.n_layer = 2;
  Transformer model(c, DType::F32, 5);
  save_model(dir / "model", model);
  auto tty = run_in_pty(
      {"quantize", dir / "model", dir / "a.gguf", "--type", "q8_0", "--tokenizer", "bytes"});
  ASSERT_EQ(tty.code, 0) << tty.out;
  EXPECT_TRUE(contains(tty.out, "\rquantize [")) << tty.out;
  EXPECT_TRUE(contains(tty.out, "100.0%")) << tty.out;
  EXPECT_TRUE(contains(tty.out, "ETA done")) << tty.out;
  EXPECT_TRUE(contains(tty.out, "wrote " + (dir / "a.gguf"))) << tty.out;

  auto pipe = test::run_nekton("quantize " + (dir / "model") + " " + (dir / "b.gguf") +
                               " --type q8_0 --tokenizer bytes");
  ASSERT_EQ(pipe.code, 0) << pipe.out;
  EXPECT_TRUE(contains(pipe.out, "wrote " + (dir / "b.gguf"))) << pipe.out;
  EXPECT_FALSE(contains(pipe.out, "\r")) << pipe.out;
  EXPECT_FALSE(contains(pipe.out, "quantize [")) << pipe.out;
  EXPECT_EQ(test::read_file(dir / "a.gguf"), test::read_file(dir / "b.gguf"));

  // Forced off on a terminal; a bad mode is named.
  auto off = run_in_pty({"export", "hf", dir / "model", dir / "hf", "--progress", "none"});
  ASSERT_EQ(off.code, 0) << off.out;
  EXPECT_FALSE(contains(off.out, "export hf [")) << off.out;  // (the terminal adds \r to \n)
  auto bad =
      test::run_nekton("import hf " + (dir / "hf") + " " + (dir / "back") + " --progress fancy");
  EXPECT_NE(bad.code, 0);
  EXPECT_TRUE(contains(bad.out,
                       "import hf: --progress: expected auto, bar, log or none, got "
                       "'fancy'"))
      << bad.out;
  auto import = run_in_pty({"import", "hf", dir / "hf", dir / "back"});
  ASSERT_EQ(import.code, 0) << import.out;
  EXPECT_TRUE(contains(import.out, "\rimport hf [")) << import.out;
}

TEST(ProgressCli, EvalCountsItsWindowsOnATerminalOnly) {
  TempDir dir("nk_progress");
  ModelConfig c = model_preset("llama-tiny");
  c.n_layer = 2;
  Transformer model(c, DType::F32, 5);
  save_model(dir / "model", model);
  const std::string readme = std::string(NK_SOURCE_DIR) + "/README.md";
  const std::vector<std::string> args = {"eval",
                                         "perplexity",
                                         "eval.model=" + (dir / "model"),
                                         "eval.text=" + readme,
                                         "eval.tokenizer=bytes",
                                         "eval.max_tokens=600",
                                         "eval.window=64"};
  auto tty = run_in_pty(args);
  ASSERT_EQ(tty.code, 0) << tty.out;
  EXPECT_TRUE(contains(tty.out, "\reval perplexity [")) << tty.out;
  EXPECT_TRUE(contains(tty.out, "10/10 windows")) << tty.out;  // 599 predictions / 64
  EXPECT_TRUE(contains(tty.out, "perplexity ")) << tty.out;
  std::string cmd;
  for (const std::string& a : args) cmd += a + " ";
  auto pipe = test::run_nekton(cmd);
  ASSERT_EQ(pipe.code, 0) << pipe.out;
  EXPECT_FALSE(contains(pipe.out, "eval perplexity [")) << pipe.out;
  EXPECT_FALSE(contains(pipe.out, "\r")) << pipe.out;
}

TEST(ProgressCli, SentencePieceTrainingShowsItsTime) {
  TempDir dir("nk_progress");
  // Every guide and README: a fraction of a second of training on a fast
  // machine, less than the bar's 0.25 s tick; the first line is shown at once.
  std::vector<std::string> inputs = {std::string(NK_SOURCE_DIR) + "/README.md",
                                     std::string(NK_SOURCE_DIR) + "/BENCHMARKS.md"};
  for (const auto& e : fs::directory_iterator(std::string(NK_SOURCE_DIR) + "/docs"))
    if (e.path().extension() == ".md") inputs.push_back(e.path().string());
  std::vector<std::string> args = {"tokenizer", "train", "--type", "sentencepiece", "--input"};
  args.insert(args.end(), inputs.begin(), inputs.end());
  args.insert(args.end(), {"--vocab-size", "4000", "--out", dir / "a/"});
  auto tty = run_in_pty(args);
  ASSERT_EQ(tty.code, 0) << tty.out;
  EXPECT_TRUE(contains(tty.out, "\rtokenizer train sentencepiece: training ")) << tty.out;
  EXPECT_TRUE(contains(tty.out, "trained sentencepiece")) << tty.out;
  std::string cmd;
  for (size_t i = 0; i + 2 < args.size(); ++i) cmd += args[i] + " ";
  auto pipe = test::run_nekton(cmd + "--out " + (dir / "b/"));
  ASSERT_EQ(pipe.code, 0) << pipe.out;
  // In a pipe: plain log lines (the first at once, then one every 10 s).
  EXPECT_FALSE(contains(pipe.out, "\r")) << pipe.out;
  EXPECT_TRUE(contains(pipe.out, "[info] tokenizer train sentencepiece: training ")) << pipe.out;
  EXPECT_EQ(test::read_file(dir / "a/tokenizer.model"), test::read_file(dir / "b/tokenizer.model"));
}

TEST(ProgressCli, BpeTrainingCountsItsMerges) {
  TempDir dir("nk_progress");
  const std::string readme = std::string(NK_SOURCE_DIR) + "/README.md";
  auto tty = run_in_pty({"tokenizer", "train", "--type", "bpe", "--input", readme, "--vocab-size",
                         "400", "--out", dir / "a"});
  ASSERT_EQ(tty.code, 0) << tty.out;
  EXPECT_TRUE(contains(tty.out, "\rtokenizer train [")) << tty.out;
  EXPECT_TRUE(contains(tty.out, "/143 merges")) << tty.out;  // 400 - 256 bytes - 1 special
  auto pipe = test::run_nekton("tokenizer train --type bpe --input " + readme +
                               " --vocab-size 400 --out " + (dir / "b"));
  ASSERT_EQ(pipe.code, 0) << pipe.out;
  EXPECT_FALSE(contains(pipe.out, "tokenizer train [")) << pipe.out;
  EXPECT_EQ(test::read_file(dir / "a/vocab.tiktoken"), test::read_file(dir / "b/vocab.tiktoken"));
}

// Loading: a saved model's safetensors, a GGUF file and a training
// checkpoint each show "loading FILE [...] 100.0% ... MB ... ETA done" on a
// terminal, and nothing of it in a pipe.
TEST(ProgressCli, LoadingAModelAGgufAndACheckpointShowsBytes) {
  TempDir dir("nk_progress");
  ModelConfig c = model_preset("llama-tiny");
  c.n_layer = 2;
  Transformer model(c, DType::F32, 5);
  save_model(dir / "model", model);
  const std::string readme = std::string(NK_SOURCE_DIR) + "/README.md";
  const std::vector<std::string> eval = {"eval",
                                         "perplexity",
                                         "eval.model=" + (dir / "model"),
                                         "eval.text=" + readme,
                                         "eval.tokenizer=bytes",
                                         "eval.max_tokens=100",
                                         "eval.window=64"};
  auto tty = run_in_pty(eval);
  ASSERT_EQ(tty.code, 0) << tty.out;
  const std::string st = "\rloading " + (dir / "model/model.safetensors") + " [";
  EXPECT_TRUE(contains(tty.out, st)) << tty.out;
  EXPECT_TRUE(contains(tty.out, "100.0%")) << tty.out;
  EXPECT_TRUE(contains(tty.out, " MB/s  ETA done")) << tty.out;
  std::string cmd;
  for (const std::string& a : eval) cmd += a + " ";
  auto pipe = test::run_nekton(cmd);
  ASSERT_EQ(pipe.code, 0) << pipe.out;
  EXPECT_FALSE(contains(pipe.out, "loading ")) << pipe.out;
  EXPECT_FALSE(contains(pipe.out, "\r")) << pipe.out;

  // GGUF.
  ASSERT_EQ(test::run_nekton("quantize " + (dir / "model") + " " + (dir / "m.gguf") +
                             " --type q8_0 --tokenizer bytes")
                .code,
            0);
  const std::vector<std::string> gen = {"generate", "generate.model=" + (dir / "m.gguf"),
                                        "generate.prompt=A", "generate.max_tokens=2"};
  auto gguf = run_in_pty(gen);
  ASSERT_EQ(gguf.code, 0) << gguf.out;
  EXPECT_TRUE(contains(gguf.out, "\rloading " + (dir / "m.gguf") + " [")) << gguf.out;
  EXPECT_TRUE(contains(gguf.out, "ETA done")) << gguf.out;
  auto gguf_pipe = test::run_nekton(gen[0] + " " + gen[1] + " " + gen[2] + " " + gen[3]);
  ASSERT_EQ(gguf_pipe.code, 0) << gguf_pipe.out;
  EXPECT_FALSE(contains(gguf_pipe.out, "loading ")) << gguf_pipe.out;

  // A training checkpoint, read back when the run resumes.
  const std::string train =
      "train model.preset=gpt-tiny model.n_layer=1 model.d_model=32 model.n_head=2 "
      "model.d_ff=64 train.micro_batch=2 train.seq_len=16 train.global_batch=2 "
      "train.val_every=0 train.peak_tflops=1 train.save_every=2 data.path=" +
      readme + " train.out_dir=" + (dir / "run");
  ASSERT_EQ(test::run_nekton(train + " train.steps=2").code, 0);
  std::vector<std::string> resume = {"train"};
  for (size_t at = 6, next; at < train.size(); at = next + 1) {
    next = train.find(' ', at);
    if (next == std::string::npos) next = train.size();
    resume.push_back(train.substr(at, next - at));
  }
  resume.push_back("train.steps=3");
  auto ckpt = run_in_pty(resume);
  ASSERT_EQ(ckpt.code, 0) << ckpt.out;
  EXPECT_TRUE(contains(ckpt.out, "\rloading checkpoint " + (dir / "run/checkpoints/"))) << ckpt.out;
  EXPECT_TRUE(contains(ckpt.out, "ETA done")) << ckpt.out;
  auto ckpt_pipe = test::run_nekton(train + " train.steps=4");
  ASSERT_EQ(ckpt_pipe.code, 0) << ckpt_pipe.out;
  EXPECT_FALSE(contains(ckpt_pipe.out, "loading checkpoint")) << ckpt_pipe.out;
}

}  // namespace
}  // namespace nk
