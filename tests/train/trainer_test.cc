#include "train/trainer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "ckpt/model_io.h"
#include "ops/kernel_profile.h"

#include "test_paths.h"
#include "train/corpus.h"

namespace nk {
namespace {

namespace fs = std::filesystem;

using test::corpus_path;

// `out` is emptied first: a folder left by an earlier run would be resumed.
TrainConfig tiny(const std::string& out, DType dt, const std::string& preset = "gpt-tiny") {
  fs::remove_all(out);
  ConfigSchema s = train_schema();
  Config c = Config::load(
      s, "",
      {"model.preset=" + preset, "model.n_layer=2", "model.d_model=64", "model.n_head=4",
       "model.d_ff=128", "data.path=" + corpus_path(), "train.micro_batch=4", "train.seq_len=32",
       "train.global_batch=8", "train.steps=12", "train.lr=3e-3", "train.warmup_steps=2",
       "train.val_every=6", "train.log_every=100", "train.peak_tflops=1", "train.out_dir=" + out,
       std::string("train.dtype=") + dtype_name(dt)});
  if (preset == "llama-tiny") c.set("model.n_kv_head", "2", "test");
  return train_config_from(c);
}

std::vector<double> losses(const Trainer& t) {
  std::vector<double> v;
  for (auto& s : t.history()) v.push_back(s.loss);
  return v;
}

TEST(Trainer, IdenticalRunsGiveBitIdenticalLosses) {
  for (DType dt : {DType::F32, DType::BF16}) {
    fs::path base = fs::path(NK_BINARY_DIR) / "trainer_test";
    Trainer a(tiny((base / "a").string(), dt));
    a.run();
    Trainer b(tiny((base / "b").string(), dt));
    b.run();
    auto la = losses(a), lb = losses(b);
    ASSERT_EQ(la.size(), 12u);
    for (size_t i = 0; i < la.size(); ++i)
      EXPECT_EQ(la[i], lb[i]) << dtype_name(dt) << " step " << i + 1;  // bit for bit
    // And it learns: the loss falls well below its start.
    EXPECT_LT(la.back(), la.front() - 0.5) << dtype_name(dt);
    EXPECT_FALSE(std::isnan(a.history()[5].val_loss));
    EXPECT_TRUE(fs::exists(base / "a" / "model" / "model.safetensors"));
    EXPECT_TRUE(fs::exists(base / "a" / "metrics.jsonl"));
  }
}

// train.profile: the same losses and weights bit for bit (the timing
// wrappers call the same kernels), and a table of the steps after the first
// whose kernels are the step's own: the products, attention, the loss and
// the optimizer each called every step, self times within the step's.
TEST(Trainer, ProfileTimesTheStepsKernelsAndChangesNoNumber) {
  fs::path base = fs::path(NK_BINARY_DIR) / "trainer_profile";
  Trainer plain(tiny((base / "plain").string(), DType::F32));
  plain.run();
  TrainConfig cfg = tiny((base / "profiled").string(), DType::F32);
  cfg.profile = true;
  Trainer t(cfg);
  t.run();
  EXPECT_EQ(losses(t), losses(plain));
  const Tensor& a = t.model().params();
  const Tensor& b = plain.model().params();
  ASSERT_EQ(a.nbytes(), b.nbytes());
  EXPECT_EQ(0, std::memcmp(a.raw(), b.raw(), a.nbytes()));
  EXPECT_FALSE(ops::kernel_profiling());  // off again after the run

  std::ifstream in(base / "profiled" / "profile.json");
  ASSERT_TRUE(in) << "no profile.json";
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["steps"].get<int>(), 11);  // steps 2-12
  const double step_ms = j["step_ms"].get<double>();
  EXPECT_GT(step_ms, 0);
  double sum = 0;
  std::map<std::string, double> calls;
  for (const auto& k : j["kernels"]) {
    sum += k["ms_per_step"].get<double>();
    calls[k["name"].get<std::string>()] = k["calls_per_step"].get<double>();
  }
  EXPECT_LE(sum, step_ms * 1.001);  // self times: nothing counted twice
  EXPECT_NEAR(j["outside_kernels_ms"].get<double>(), step_ms - sum, 1e-6 * step_ms + 1e-9);
  // Every product of the forward has its backward (no recompute).
  for (const char* k : {"linear_forward", "linear_backward", "attention_forward",
                        "attention_backward", "cross_entropy_forward_backward", "adamw_step"})
    EXPECT_GT(calls[k], 0) << k;
  EXPECT_EQ(calls["linear_forward"], calls["linear_backward"]);
}

// train.device picks where the model lives; a device this build lacks, or an
// unknown name, is refused naming the key before anything is allocated.
// train.recompute: the same losses and final weights, bit for bit, as a run
// that keeps every activation (GPT-2 f32, Llama bf16).
TEST(Trainer, RecomputeChangesNoNumber) {
  fs::path base = fs::path(NK_BINARY_DIR) / "trainer_recompute";
  for (const auto& [preset, dt] :
       {std::pair{"gpt-tiny", DType::F32}, {"llama-tiny", DType::BF16}}) {
    Trainer plain(tiny((base / "plain").string(), dt, preset));
    plain.run();
    for (const char* policy : {"selective", "full"}) {
      TrainConfig cfg = tiny((base / policy).string(), dt, preset);
      cfg.recompute = policy;
      Trainer t(cfg);
      t.run();
      EXPECT_EQ(losses(t), losses(plain)) << preset << " " << policy;
      const Tensor& a = t.model().params();
      const Tensor& b = plain.model().params();
      ASSERT_EQ(a.nbytes(), b.nbytes());
      EXPECT_EQ(0, std::memcmp(a.raw(), b.raw(), a.nbytes())) << preset << " " << policy;
    }
  }
}

TEST(Trainer, DeviceComesFromTrainDevice) {
  const std::string out = (fs::path(NK_BINARY_DIR) / "trainer_device").string();
  auto with_device = [&](const std::string& d) {
    ConfigSchema s = train_schema();
    Config c = Config::load(s, "", {"data.path=" + corpus_path(), "train.out_dir=" + out});
    c.set("train.device", d, "test");
    return train_config_from(c);
  };
  TrainConfig cpu = with_device("cpu");
  cpu.steps = 1;
  cpu.model.n_layer = 1;
  Trainer t(cpu);
  EXPECT_EQ(t.model().device(), parse_device("cpu", "k"));
  EXPECT_EQ(t.model().params().device(), t.model().device());
  EXPECT_EQ(t.model().grads().device(), t.model().device());
  if (!device_available(Device::CUDA)) try {
      with_device("cuda");
      FAIL() << "cuda accepted in a build without it";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("train.device: device 'cuda' is not available"),
                std::string::npos)
          << e.what();
    }
  try {
    with_device("tpu");
    FAIL() << "an unknown device accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.device: unknown device 'tpu'"), std::string::npos)
        << e.what();
  }
}

TEST(Trainer, LlamaLearnsInBf16) {
  Trainer t(tiny((fs::path(NK_BINARY_DIR) / "trainer_llama").string(), DType::BF16, "llama-tiny"));
  t.run();
  auto l = losses(t);
  EXPECT_LT(l.back(), l.front() - 0.5);
}

TEST(Trainer, SavedModelReloadsToSameLoss) {
  fs::path out = fs::path(NK_BINARY_DIR) / "trainer_reload";
  Trainer t(tiny(out.string(), DType::F32));
  t.run();
  auto m = load_model((out / "model").string(), DType::F32);
  Activations a1(t.model().config(), DType::F32, 1, 16, false);
  Activations a2(t.model().config(), DType::F32, 1, 16, false);
  Tensor tok = Tensor::empty({1, 16}, DType::I32);
  std::vector<int32_t> ids(16);
  for (int i = 0; i < 16; ++i) ids[i] = 'a' + i;
  ops::copy_bytes_from_host(tok, ids.data());
  Tensor tgt = tok;
  EXPECT_EQ(t.model().forward_loss(a1, tok, tgt), m->forward_loss(a2, tok, tgt));
}

TEST(Trainer, GradientAccumulationEqualsOneBigBatch) {
  // Two micro-batches of 2 with scale 1/2 give the gradient of one batch of 4.
  ModelConfig c = model_preset("gpt-tiny");
  c.n_layer = 1;
  c.d_model = 32;
  c.n_head = c.n_kv_head = 2;
  c.d_ff = 64;
  Transformer m(c, DType::F32, 3);
  std::vector<int32_t> ids(4 * 8);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 37) % 257);
  Tensor tok = Tensor::empty({4, 8}, DType::I32);
  ops::copy_bytes_from_host(tok, ids.data());
  Activations big(c, DType::F32, 4, 8, true), small(c, DType::F32, 2, 8, true);
  m.zero_grads();
  m.forward_backward(big, tok, tok, 1.f);
  std::vector<float> g1(size_t(m.grads().numel())), g2(g1.size());
  ops::copy_to_host(m.grads(), g1.data());
  m.zero_grads();
  m.forward_backward(small, tok.narrow0(0, 2), tok.narrow0(0, 2), 0.5f);
  m.forward_backward(small, tok.narrow0(2, 2), tok.narrow0(2, 2), 0.5f);
  ops::copy_to_host(m.grads(), g2.data());
  double mx = 0, diff = 0;
  for (size_t i = 0; i < g1.size(); ++i) {
    mx = std::max(mx, double(std::fabs(g1[i])));
    diff = std::max(diff, double(std::fabs(g1[i] - g2[i])));
  }
  EXPECT_GT(mx, 0);
  EXPECT_LT(diff, 1e-5 * mx);  // fp32 summation order only
}

}  // namespace
}  // namespace nk
