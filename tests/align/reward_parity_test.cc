// The reward model's training against an independent float64 PyTorch
// reference (tests/align/reward_reference.py, the Bradley-Terry loss from
// its definition, with TRL's margin and centring terms): a tiny Llama and a
// tiny GPT-2 made sequence classifiers (num_labels 1, a score head in place
// of the LM head), one micro-batch of preference rows through
// RewardObjective (the path `nekton align align.method=rm` runs), 5 AdamW
// steps with clipping; every step's loss and every final weight within 1e-4
// relative (per tensor, max |ours - torch| / max |torch|).
#include <gtest/gtest.h>

#include <filesystem>

#include "align/attribute_objective.h"
#include "align/objective_steps.h"
#include "align/reward_objective.h"
#include "ckpt/model_io.h"
#include "ckpt/safetensors.h"
#include "core/atomic_file.h"
#include "core/rng.h"
#include "data/dataset/data_loader.h"
#include "model/arch.h"
#include "model/parity_steps.h"
#include "model/tiny_config.h"
#include "tensor_util.h"
#include "test_paths.h"
#include "test_util.h"

namespace nk {
namespace {

namespace fs = std::filesystem;

// Three pairs of random tokens with margins: prompts of 3-5 tokens,
// completions of different lengths, the rows padded to T = 16.
std::shared_ptr<PreferenceData> random_pairs(int64_t vocab) {
  auto d = test::random_preference_data(vocab, {{4, 6, 9}, {3, 11, 5}, {5, 7, 7}}, 5);
  d->margin = {0.0, 0.25, 0.5};
  return d;
}

void run_parity(ModelConfig mc, double center, const std::string& tag) {
  const int64_t B = 6, T = 16;
  mc.num_labels = 1;
  const fs::path dir = fs::path(NK_BINARY_DIR) / "reward_parity" / tag;
  TrainConfig cfg = test::parity_train_config(mc, B, T, dir);
  AlignConfig ac;
  ac.method = "rm";
  ac.center_rewards_coefficient = center;
  ac.data_path = "random";
  ac.shuffle = false;
  ac.check(false);
  auto data = random_pairs(mc.vocab_size);

  Transformer model(mc, DType::F32, cfg.seed);
  save_model((dir / "model").string(), model);
  RewardObjective obj(cfg, ac, data, nullptr, 0);
  const TrainData td = obj.data(cfg);
  DataLoader loader(td.train, B, mc.vocab_size);
  Tensor tokens = Tensor::empty({B, T}, DType::I32), targets = Tensor::empty({B, T}, DType::I32);
  Tensor pos = Tensor::empty({B, T}, DType::I32), cu = Tensor::empty({B, 2}, DType::I32);
  loader.next(tokens, targets, pos, cu);
  std::vector<int32_t> last;
  for (const auto& t : data->tokens) last.push_back(int32_t(t.size()) - 1);
  std::vector<float> margins(data->margin.begin(), data->margin.end());
  save_safetensors((dir / "batch.safetensors").string(), {{"tokens", tokens},
                                                          {"last", test::i32_tensor({B}, last)},
                                                          {"margins", test::f32_tensor(margins)}});
  write_file_atomic((dir / "settings.json").string(), fmt::format(R"({{"center": {}}})", center));

  obj.prepare(model, true);
  test::run_objective_steps(obj, model, tokens, targets, dir);
  // The metrics TRL logs, from the last step's micro-batch and beyond chance.
  const ObjectiveMetrics m = obj.take_metrics(false);
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[3].first, "rewards/accuracies");
  EXPECT_NEAR(m[2].second, m[0].second - m[1].second, 1e-9);
  test::expect_python_reference_passes("align/reward_reference.py", dir, tag);
}

TEST(RewardParity, TinyLlamaWithMargins) {
  run_parity(test::tiny_config(true, 97, 32), 0.0, "llama");
}

TEST(RewardParity, TinyGpt2Centred) {
  run_parity(test::tiny_config(false, 97, 32), 0.01, "gpt2");
}

// SteerLM's attribute model: three outputs regressed on their labelled
// values (NaN: unlabelled, out of the loss), four rows of their own records.
TEST(RewardParity, TinyLlamaAttributeRegression) {
  const int64_t B = 4, T = 16;
  ModelConfig mc = test::tiny_config(true, 97, 32);
  mc.num_labels = 3;
  mc.labels = {"helpfulness", "correctness", "verbosity"};
  const fs::path dir = fs::path(NK_BINARY_DIR) / "reward_parity" / "attributes";
  fs::remove_all(dir);
  fs::create_directories(dir);
  TrainConfig cfg;
  cfg.model = mc;
  cfg.dtype = DType::F32;
  cfg.seq_len = T;
  cfg.micro_batch = cfg.global_batch = B;
  cfg.seed = 42;
  auto data = std::make_shared<AttributeData>();
  data->path = "random";
  data->attributes = mc.labels;
  Rng rng(9);
  const float values[4][3] = {{3, 1, NAN}, {0.5f, NAN, 2}, {4, 2, 1}, {NAN, 3, 0}};
  for (int r = 0; r < 4; ++r) {
    std::vector<int32_t> t;
    for (int k = 0; k < 6 + 2 * r; ++k) t.push_back(int32_t(rng.below(97)));
    data->tokens.push_back(t);
    data->values.push_back(std::vector<float>(values[r], values[r] + 3));
    data->line.push_back(r + 1);
  }
  Transformer model(mc, DType::F32, cfg.seed);
  save_model((dir / "model").string(), model);
  AttributeObjective obj(cfg, data, nullptr, 0, false);
  const TrainData td = obj.data(cfg);
  DataLoader loader(td.train, B, mc.vocab_size);
  Tensor tokens = Tensor::empty({B, T}, DType::I32), targets = Tensor::empty({B, T}, DType::I32);
  Tensor pos = Tensor::empty({B, T}, DType::I32), cu = Tensor::empty({B, 2}, DType::I32);
  loader.next(tokens, targets, pos, cu);
  std::vector<int32_t> last;
  std::vector<float> flat;
  for (int r = 0; r < 4; ++r) {
    last.push_back(int32_t(data->tokens[size_t(r)].size()) - 1);
    flat.insert(flat.end(), values[r], values[r] + 3);
  }
  Tensor v = Tensor::empty({B, 3}, DType::F32);
  std::copy(flat.begin(), flat.end(), v.data<float>());
  save_safetensors((dir / "batch.safetensors").string(),
                   {{"tokens", tokens}, {"last", test::i32_tensor({B}, last)}, {"values", v}});
  write_file_atomic((dir / "settings.json").string(), R"({"regression": true})");
  test::run_objective_steps(obj, model, tokens, targets, dir);
  const ObjectiveMetrics m = obj.take_metrics(false);
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0].first, "mse");
  EXPECT_EQ(m[3].first, "mse/verbosity");
  test::expect_python_reference_passes("align/reward_reference.py", dir, "attributes");
}

// The score head replaces the LM head: no lm_head, a [1, C] score.weight
// (tied GPT-2 too), and LM-only paths refuse the model with a clear error.
TEST(RewardModel, ScoreHeadReplacesTheLmHead) {
  for (bool llama : {true, false}) {
    ModelConfig c = test::tiny_config(llama, 97, 32);
    c.num_labels = 3;
    c.labels = {"helpfulness", "correctness", "verbosity"};
    const ParamLayout layout = model_layout(c);
    EXPECT_FALSE(layout.has("lm_head.weight"));
    ASSERT_TRUE(layout.has("score.weight"));
    EXPECT_EQ(layout.find("score.weight").shape, (Shape{3, 32}));
    Transformer m(c, DType::F32, 1);
    Activations a(m, 1, 4, false);
    Tensor tok = test::i32_tensor({1, 4}, {1, 2, 3, 4});
    Tensor logits = Tensor::empty({1, 97}, DType::F32);
    try {
      m.forward_last_logits(a, tok, logits);
      ADD_FAILURE() << "a classifier gave logits";
    } catch (const Error& e) {
      EXPECT_TRUE(test::contains(e.what(), "a sequence classifier (num_labels = 3")) << e.what();
    }
  }
}

}  // namespace
}  // namespace nk
