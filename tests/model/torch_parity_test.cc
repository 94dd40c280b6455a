// Numerical parity with an independent PyTorch implementation
// (tests/model/torch_reference.py, Debian's python3-torch): logits, loss,
// every parameter gradient and the losses of 5 AdamW steps, in fp32.
//
// Tolerance: 1e-4 relative, per tensor, as max|ours - torch| / max|torch|.
// Both sides compute in fp32 with different summation orders; over a 2-layer
// model that error is ~1e-6, so 1e-4 leaves margin yet catches any wrong term.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "ckpt/model_io.h"
#include "ckpt/safetensors.h"
#include "core/rng.h"
#include "train/adamw.h"

#include "model/parity_steps.h"
#include "model/tiny_config.h"
#include "tensor_util.h"
#include "test_paths.h"

namespace nk {
namespace {

namespace fs = std::filesystem;

using test::f32_tensor;
using test::i32_tensor;

void run_parity(const ModelConfig& cfg, const std::string& name) {
  const int64_t B = 2, T = 16;
  fs::path dir = fs::path(NK_BINARY_DIR) / "parity" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);

  Transformer model(cfg, DType::F32, 42);
  save_model((dir / "model").string(), model);

  Rng rng(7);
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (auto& t : tok) t = int32_t(rng.below(uint64_t(cfg.vocab_size)));
  for (auto& t : tgt) t = int32_t(rng.below(uint64_t(cfg.vocab_size)));
  tgt[3] = tgt[20] = int32_t(Transformer::kIgnoreIndex);  // ignored positions
  Tensor tokens = i32_tensor({B, T}, tok), targets = i32_tensor({B, T}, tgt);
  save_safetensors((dir / "batch.safetensors").string(),
                   {{"tokens", tokens}, {"targets", targets}});

  Activations acts(cfg, DType::F32, B, T, true);
  Tensor logits = Tensor::empty({B * T, cfg.vocab_size}, DType::F32);
  model.forward_all_logits(acts, tokens, logits);
  model.zero_grads();
  float loss = model.forward_backward(acts, tokens, targets, 1.f);

  std::vector<std::pair<std::string, Tensor>> out = {{"logits", logits},
                                                     {"loss", f32_tensor({loss})}};
  for (const ParamInfo& p : model.layout().params()) {
    Tensor g = Tensor::empty(p.shape, DType::F32);  // a copy: the steps below reuse grads()
    ops::convert(g, ParamLayout::view(model.grads(), p));
    out.emplace_back("grad." + p.name, g);
  }

  const std::vector<float> losses = test::ParitySteps().run(model, acts, tokens, targets, dir);
  out.emplace_back("step_losses", f32_tensor(losses));
  save_safetensors((dir / "nekton.safetensors").string(), out);
  test::expect_python_reference_passes("model/torch_reference.py", dir, name);
}

// The shared tiny shapes (vocabulary 97) at the usual init scale.
TEST(TorchParity, Gpt2) {
  ModelConfig c = test::tiny_config(false, 97, 32);
  c.init_std = 0.02;
  run_parity(c, "gpt2");
}

TEST(TorchParity, LlamaGroupedQuery) {
  ModelConfig c = test::tiny_config(true, 97, 32);
  c.init_std = 0.02;
  run_parity(c, "llama");
}

// Qwen2's q/k/v biases (gradients included), and RoPE scaling in training:
// theta 100 over head size 8 puts wavelengths of 6, 20, 63 and 199 positions
// in every band of llama3 (original context 32) and of yarn's ramp.
TEST(TorchParity, Qwen2Yarn) {
  ModelConfig c = test::tiny_config(true, 97, 32);
  c.arch = "qwen2";
  c.init_std = 0.02;
  c.rope_theta = 100;
  c.rope_scaling.type = RopeScalingType::Yarn;
  c.rope_scaling.factor = 4;
  c.rope_scaling.original_max_seq_len = 16;
  run_parity(c, "qwen2_yarn");
}

TEST(TorchParity, LlamaLlama3Scaling) {
  ModelConfig c = test::tiny_config(true, 97, 32);
  c.init_std = 0.02;
  c.rope_theta = 100;
  c.rope_scaling.type = RopeScalingType::Llama3;
  c.rope_scaling.factor = 8;
  c.rope_scaling.low_freq_factor = 1;
  c.rope_scaling.high_freq_factor = 4;
  c.rope_scaling.original_max_seq_len = 32;
  run_parity(c, "llama_llama3");
}

}  // namespace
}  // namespace nk
