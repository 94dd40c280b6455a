// Whole training runs on the CUDA backend against the same runs on the CPU
// (the f32 reference): GPT-2 and Llama shapes, f32 and bf16, the same data
// and seeds. And a CUDA run stopped and resumed from its checkpoint gives the
// very same numbers as an uninterrupted one (every CUDA kernel is
// deterministic). Without a GPU every case is reported as skipped.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "ops/kernel_profile.h"
#include "ops/ops.h"
#include "test_paths.h"
#include "test_util.h"
#include "train/corpus.h"
#include "train/trainer.h"

namespace nk {
namespace {

namespace fs = std::filesystem;

class CudaTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_available(Device::CUDA))
      GTEST_SKIP() << "cuda not run: " << why_unavailable(Device::CUDA);
  }
};

// `out` is emptied first unless `resume`.
TrainConfig tiny(const std::string& preset, const char* dtype, const char* device,
                 const std::string& out, const std::vector<std::string>& extra = {},
                 bool resume = false) {
  if (!resume) fs::remove_all(out);
  std::vector<std::string> ov = {"model.preset=" + preset,
                                 "model.n_layer=2",
                                 "model.d_model=64",
                                 "model.n_head=4",
                                 "model.d_ff=128",
                                 "data.path=" + test::corpus_path(),
                                 "train.micro_batch=4",
                                 "train.seq_len=32",
                                 "train.global_batch=8",
                                 "train.steps=12",
                                 "train.lr=3e-3",
                                 "train.warmup_steps=2",
                                 "train.val_every=6",
                                 "train.log_every=100",
                                 "train.peak_tflops=1",
                                 std::string("train.dtype=") + dtype,
                                 std::string("train.device=") + device,
                                 "train.out_dir=" + out};
  if (preset == "llama-tiny") ov.push_back("model.n_kv_head=2");
  ov.insert(ov.end(), extra.begin(), extra.end());
  return train_config_from(Config::load(train_schema(), "", ov));
}

std::vector<float> host_floats(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  ops::copy_to_host(t, v.data());
  return v;
}

// |a - b| / |b| over whole vectors.
double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    n += double(b[i]) * b[i];
  }
  return std::sqrt(d / std::max(n, 1e-30));
}

// Losses, validation losses and the first step's gradients agree with the
// CPU's. Tolerances: f32 differs only in the order of fp32 sums (cuBLASLt's
// tiles against oneDNN's, a warp's reductions against a loop): ~1e-6
// relative per op, and Adam over 12 steps keeps it within 2e-4 of the loss.
// bf16 rounds every activation once more or less where the orders differ
// (2^-8 each): 2e-3 on the first step's loss, 1% after 12 steps (seen: 0.07%
// on a 4-layer Llama after 20 steps), 2% on the gradients.
void expect_matches_cpu(const std::string& preset, const char* dtype) {
  SCOPED_TRACE(preset + " " + dtype);
  const fs::path base = fs::path(NK_BINARY_DIR) / "cuda_train";
  const bool f32 = std::string(dtype) == "f32";
  std::vector<float> grads[2];
  std::vector<StepStats> hist[2];
  int i = 0;
  for (const char* dev : {"cpu", "cuda"}) {
    // One step for the gradients, then the whole run.
    Trainer one(tiny(preset, dtype, dev, (base / dev).string(), {"train.steps=1"}));
    one.run();
    EXPECT_EQ(one.model().grads().device(), parse_device(dev, "dev"));
    grads[i] = host_floats(one.model().grads());
    Trainer all(tiny(preset, dtype, dev, (base / dev).string()));
    all.run();
    hist[i++] = all.history();
  }
  EXPECT_LT(rel_l2(grads[1], grads[0]), f32 ? 1e-4 : 2e-2);
  ASSERT_EQ(hist[0].size(), 12u);
  ASSERT_EQ(hist[1].size(), 12u);
  EXPECT_NEAR(hist[1][0].loss, hist[0][0].loss, (f32 ? 1e-5 : 2e-3) * hist[0][0].loss);
  for (size_t s = 0; s < 12; ++s) {
    EXPECT_NEAR(hist[1][s].loss, hist[0][s].loss, (f32 ? 2e-4 : 1e-2) * hist[0][s].loss)
        << "step " << s + 1;
    if (!std::isnan(hist[0][s].val_loss)) {
      EXPECT_NEAR(hist[1][s].val_loss, hist[0][s].val_loss,
                  (f32 ? 2e-4 : 1e-2) * hist[0][s].val_loss)
          << "step " << s + 1;
    }
  }
  EXPECT_LT(hist[1].back().loss, hist[1].front().loss - 0.5);  // it learns on the GPU too
}

TEST_F(CudaTraining, MatchesTheCpu) {
  for (const auto& [preset, dtype] : {std::pair{"gpt-tiny", "f32"},
                                      {"llama-tiny", "f32"},
                                      {"gpt-tiny", "bf16"},
                                      {"llama-tiny", "bf16"}})
    expect_matches_cpu(preset, dtype);
}

// A CUDA run stopped at step 5 and resumed from its checkpoint (written from
// device memory, read back into it) continues bit for bit: the same losses,
// gradient norms and final weights.
TEST_F(CudaTraining, ResumesExactlyFromItsCheckpoint) {
  const fs::path base = fs::path(NK_BINARY_DIR) / "cuda_resume";
  for (const char* dtype : {"f32", "bf16"}) {
    SCOPED_TRACE(dtype);
    Trainer straight(tiny("llama-tiny", dtype, "cuda", (base / "straight").string()));
    straight.run();
    const std::string split = (base / "split").string();
    Trainer head(tiny("llama-tiny", dtype, "cuda", split, {"train.exit_at_step=5"}));
    head.run();
    ASSERT_EQ(head.history().size(), 5u);
    ASSERT_TRUE(fs::exists(fs::path(split) / "checkpoints/step_00000005/manifest.json"));
    Trainer tail(tiny("llama-tiny", dtype, "cuda", split, {}, true));
    ASSERT_EQ(tail.state().step, 5);
    tail.run();
    std::vector<StepStats> joined = head.history();
    joined.insert(joined.end(), tail.history().begin(), tail.history().end());
    ASSERT_EQ(joined.size(), straight.history().size());
    for (size_t s = 0; s < joined.size(); ++s) {
      EXPECT_EQ(joined[s].loss, straight.history()[s].loss) << "step " << s + 1;
      EXPECT_EQ(joined[s].grad_norm, straight.history()[s].grad_norm) << "step " << s + 1;
    }
    EXPECT_EQ(host_floats(tail.model().params()), host_floats(straight.model().params()));
  }
}

// train.profile on CUDA: the same numbers bit for bit as an unprofiled run
// (the timing wrappers call the same kernels), and a table of the device
// kernels each step calls, each with a device time.
TEST_F(CudaTraining, ProfileTimesTheDeviceKernelsAndChangesNoNumber) {
  const fs::path base = fs::path(NK_BINARY_DIR) / "cuda_profile";
  Trainer plain(tiny("llama-tiny", "bf16", "cuda", (base / "plain").string()));
  plain.run();
  Trainer t(
      tiny("llama-tiny", "bf16", "cuda", (base / "profiled").string(), {"train.profile=true"}));
  t.run();
  ASSERT_EQ(t.history().size(), plain.history().size());
  for (size_t s = 0; s < t.history().size(); ++s)
    EXPECT_EQ(t.history()[s].loss, plain.history()[s].loss) << "step " << s + 1;
  EXPECT_EQ(host_floats(t.model().params()), host_floats(plain.model().params()));
  EXPECT_FALSE(ops::kernel_profiling());  // off again after the run

  std::ifstream in(base / "profiled" / "profile.json");
  ASSERT_TRUE(in) << "no profile.json";
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["device"], "cuda");
  EXPECT_EQ(j["steps"].get<int>(), 11);  // steps 2-12
  std::map<std::string, double> calls, ms;
  for (const auto& k : j["kernels"]) {
    calls[k["name"].get<std::string>()] = k["calls_per_step"].get<double>();
    ms[k["name"].get<std::string>()] = k["ms_per_step"].get<double>();
  }
  for (const char* k : {"linear_forward", "linear_backward", "attention_forward",
                        "attention_backward", "cross_entropy_forward_backward", "adamw_step"}) {
    EXPECT_GT(calls[k], 0) << k;
    EXPECT_GT(ms[k], 0) << k;
  }
  EXPECT_EQ(calls["linear_forward"], calls["linear_backward"]);
}

}  // namespace
}  // namespace nk
