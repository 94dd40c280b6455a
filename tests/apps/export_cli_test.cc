// `nekton export hf` and `export gguf` killed at random moments, then rerun:
// the output equals an uninterrupted export and nothing a killed run left
// (OUT.tmp.PID, OUT.gguf.tmp.PID, lock files) remains; a busy output is
// refused with the holder's pid.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include "ckpt/model_io.h"
#include "core/output_lock.h"
#include "model/transformer.h"
#include "test_util.h"

namespace nk {
namespace {

namespace fs = std::filesystem;
using test::contains;
using test::TempDir;
using Clock = std::chrono::steady_clock;

// Every file under `path` (a folder, or one file) by its relative name.
std::map<std::string, std::string> contents(const std::string& path) {
  std::map<std::string, std::string> files;
  if (fs::is_regular_file(path)) return {{"", test::read_file(path)}};
  for (auto& e : fs::recursive_directory_iterator(path))
    if (e.is_regular_file())
      files[fs::relative(e.path(), path).string()] = test::read_file(e.path().string());
  return files;
}

struct ExportCase {
  std::string kind;  // "hf" or "gguf"
  std::string out(const TempDir& dir, const std::string& name) const {
    return dir / (kind == "hf" ? name : name + ".gguf");
  }
  std::vector<std::string> args(const std::string& model, const std::string& out) const {
    if (kind == "hf") return {"export", "hf", model, out, "--overwrite"};
    return {"export", "gguf", model, out, "--tokenizer", "bytes"};
  }
};

// A Llama-family model (both formats take it), large enough (~10 MB) that a
// kill often lands while the export writes.
void save_tiny_model(const std::string& dir) {
  ModelConfig c = model_preset("llama-tiny");
  c.n_layer = 4;
  c.d_model = 256;
  c.d_ff = 688;
  Transformer model(c, DType::F32, 5);
  save_model(dir, model);
}

std::string joined(const std::vector<std::string>& args) {
  std::string s;
  for (const auto& a : args) s += a + " ";
  return s;
}

TEST(ExportCli, KillNineThenRerunLeavesNoTemporaries) {
  TempDir dir("nk_export_kill");
  save_tiny_model(dir / "model");
  std::mt19937 rng(3);
  for (const ExportCase& c : {ExportCase{"hf"}, ExportCase{"gguf"}}) {
    SCOPED_TRACE(c.kind);
    const std::string ref = c.out(dir, c.kind + "_ref");
    auto t0 = Clock::now();
    auto r = test::run_nekton(joined(c.args(dir / "model", ref)));
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    ASSERT_EQ(r.code, 0) << r.out;
    const auto want = contents(ref);
    std::uniform_real_distribution<double> when(0.2 * secs, 0.95 * secs);
    int mid_write = 0;
    for (int trial = 0; trial < 3; ++trial) {
      SCOPED_TRACE(trial);
      const std::string out = c.out(dir, c.kind + "_t" + std::to_string(trial));
      pid_t pid = test::spawn_nekton(c.args(dir / "model", out), dir / "export.log");
      ASSERT_GT(pid, 0);
      std::this_thread::sleep_for(std::chrono::duration<double>(when(rng)));
      ::kill(pid, SIGKILL);
      int st = 0;
      ::waitpid(pid, &st, 0);
      // A kill while writing leaves OUT.tmp.PID; where this one came too
      // early or too late, leave what it would have left.
      const std::string tmp = out + ".tmp." + std::to_string(pid);
      if (fs::exists(tmp)) {
        ++mid_write;
      } else if (c.kind == "hf") {
        fs::create_directories(tmp);
        test::write_file(tmp + "/model.safetensors", "partial");
      } else {
        test::write_file(tmp, "GGUF partial");
      }
      r = test::run_nekton(joined(c.args(dir / "model", out)));
      ASSERT_EQ(r.code, 0) << r.out;
      EXPECT_TRUE(contents(out) == want) << out;
    }
    std::printf("%s: kills that landed in the write: %d of 3\n", c.kind.c_str(), mid_write);
  }
  fs::remove(dir / "export.log");
  EXPECT_EQ(test::leftover_files(dir.path().string()), std::vector<std::string>{});
}

TEST(ExportCli, BusyOutputFailsNamingThePid) {
  TempDir dir("nk_export_busy");
  save_tiny_model(dir / "model");
  for (const ExportCase& c : {ExportCase{"hf"}, ExportCase{"gguf"}}) {
    SCOPED_TRACE(c.kind);
    const std::string out = c.out(dir, "busy");
    {
      OutputLock held(out, LockAt::Beside);
      auto r = test::run_nekton(joined(c.args(dir / "model", out)));
      EXPECT_EQ(r.code, 1) << r.out;
      EXPECT_TRUE(contains(r.out, "'" + out + "' is in use by nekton pid " +
                                      std::to_string(::getpid()) + " (lock file '" + out +
                                      ".lock')"))
          << r.out;
      EXPECT_FALSE(fs::exists(out));
    }
    auto r = test::run_nekton(joined(c.args(dir / "model", out)));
    EXPECT_EQ(r.code, 0) << r.out;
  }
  EXPECT_EQ(test::leftover_files(dir.path().string()), std::vector<std::string>{});
}

}  // namespace
}  // namespace nk
