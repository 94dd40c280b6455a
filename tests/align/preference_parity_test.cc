// Every preference loss and its gradient against an independent float64
// PyTorch reference (tests/align/preference_reference.py, from the papers'
// and TRL's formulas): a tiny Llama and a tiny GPT-2, one micro-batch of
// preference rows through PreferenceObjective (the path `nekton align`
// runs), 5 AdamW steps with clipping; every step's loss and every final
// weight within 1e-4 relative (per tensor, max |ours - torch| / max |torch|).
#include <gtest/gtest.h>

#include <filesystem>

#include "align/objective_steps.h"
#include "align/preference_objective.h"
#include "ckpt/model_io.h"
#include "ckpt/safetensors.h"
#include "core/atomic_file.h"
#include "core/rng.h"
#include "data/dataset/data_loader.h"
#include "model/parity_steps.h"
#include "model/tiny_config.h"
#include "tensor_util.h"
#include "test_paths.h"
#include "test_util.h"

namespace nk {
namespace {

namespace fs = std::filesystem;

// Two examples of random tokens: prompts of 3-4 tokens, completions of
// different lengths, the rows padded to T = 16.
std::shared_ptr<PreferenceData> random_pairs(int64_t vocab, bool kto) {
  auto d = test::random_preference_data(vocab, {{4, 6, 9}, {3, 11, 5}}, 11);
  if (kto) d->desirable = {1, 0};
  return d;
}

struct Method {
  std::string name, method, loss_type = "sigmoid";
  double beta = 0.1, label_smoothing = 0, rpo_alpha = 0, simpo_gamma = 0.5, cpo_alpha = 0;
  double desirable_weight = 1, undesirable_weight = 1;
};

void run_parity(const ModelConfig& mc, const Method& m, const std::string& tag) {
  const int64_t B = 4, T = 16;
  const fs::path dir = fs::path(NK_BINARY_DIR) / "align_parity" / (tag + "_" + m.name);
  TrainConfig cfg = test::parity_train_config(mc, B, T, dir);
  AlignConfig ac;
  ac.method = m.method;
  ac.loss_type = m.loss_type;
  ac.loss.beta = m.beta;
  ac.loss.label_smoothing = m.label_smoothing;
  ac.loss.rpo_alpha = m.rpo_alpha;
  ac.loss.simpo_gamma = m.simpo_gamma;
  ac.loss.cpo_alpha = m.cpo_alpha;
  ac.loss.desirable_weight = m.desirable_weight;
  ac.loss.undesirable_weight = m.undesirable_weight;
  ac.data_path = "random";
  ac.shuffle = false;
  ac.check(false);
  const bool kto = ac.loss.method == PreferenceMethod::Kto;
  auto data = random_pairs(mc.vocab_size, kto);

  Transformer model(mc, DType::F32, cfg.seed);
  save_model((dir / "model").string(), model);
  PreferenceObjective obj(cfg, ac, data, nullptr, 0);
  const TrainData td = obj.data(cfg);
  DataLoader loader(td.train, B, mc.vocab_size);
  Tensor tokens = Tensor::empty({B, T}, DType::I32), targets = Tensor::empty({B, T}, DType::I32);
  Tensor pos = Tensor::empty({B, T}, DType::I32), cu = Tensor::empty({B, 2}, DType::I32);
  loader.next(tokens, targets, pos, cu);
  std::vector<std::pair<std::string, Tensor>> batch = {{"tokens", tokens}, {"targets", targets}};
  if (kto) batch.emplace_back("labels", test::f32_tensor({1.f, 0.f}));
  save_safetensors((dir / "batch.safetensors").string(), batch);
  write_file_atomic(
      (dir / "settings.json").string(),
      fmt::format(R"({{"method": "{}", "loss_type": "{}", "beta": {}, "label_smoothing": {},
 "rpo_alpha": {}, "simpo_gamma": {}, "cpo_alpha": {}, "desirable_weight": {},
 "undesirable_weight": {}}})",
                  ac.method, ac.loss_type, m.beta, m.label_smoothing, m.rpo_alpha, m.simpo_gamma,
                  m.cpo_alpha, m.desirable_weight, m.undesirable_weight));

  obj.prepare(model, true);
  test::run_objective_steps(obj, model, tokens, targets, dir);
  test::expect_python_reference_passes("align/preference_reference.py", dir, tag + " " + m.name);
}

std::vector<Method> methods() {
  return {
      {.name = "dpo_cdpo_rpo", .method = "dpo", .label_smoothing = 0.1, .rpo_alpha = 0.5},
      {.name = "dpo_robust", .method = "dpo", .loss_type = "robust", .label_smoothing = 0.2},
      {.name = "hinge", .method = "hinge", .beta = 0.05},  // the hinge stays active
      {.name = "ipo", .method = "ipo"},
      {.name = "kto", .method = "kto", .desirable_weight = 1.0, .undesirable_weight = 1.5},
      {.name = "orpo", .method = "orpo"},
      {.name = "simpo", .method = "simpo", .beta = 2.0, .cpo_alpha = 0.3},
  };
}

class PreferenceParity : public ::testing::TestWithParam<Method> {};

TEST_P(PreferenceParity, TinyLlama) {
  ModelConfig c = test::tiny_config(true, 97, 32);
  c.init_std = 0.02;
  run_parity(c, GetParam(), "llama");
}

TEST_P(PreferenceParity, TinyGpt2) {
  ModelConfig c = test::tiny_config(false, 97, 32);
  c.init_std = 0.02;
  run_parity(c, GetParam(), "gpt2");
}

INSTANTIATE_TEST_SUITE_P(Losses, PreferenceParity, ::testing::ValuesIn(methods()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace nk
